"""A completion means one thing on every path, on every live database: the Python
client, ``processor complete`` as a subprocess, ``POST /v1/completions/{token}`` over
real HTTP and the console's Complete form (a real POST to the console) each give the
waiting item the answer its handler would have given. ``{"gate": 1}`` moves it to gate 1
where it runs (the approval example's filing step is not skipped), ``done`` completes
it, and nothing runs it again at its gate: the four items end in the same state."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.console.server import ConsoleOptions, console_running
from tests.acceptance.harness.processes import run_cli
from tests.integration.test_waits import Parker, config
from tests.support.engine import running, wait_until
from watcher import Watcher
from watcher.store.db.urls import parse_database_url

PATHS = ("client", "cli", "api", "console")

# (the answer as a completion's JSON, the item's state after it: status, gate, data)
CASES = {
    "gate": ({"gate": 1, "data": {"approved": True}},
             ("available", 1, b'{"approved":true}')),
    "gate-done": ({"gate": 1, "done": True}, ("complete", 1, b'"parked"')),
    "done": ({"done": True, "data": "é"}, ("complete", 0, '"é"'.encode())),
    "nothing": ({}, ("available", 0, b'"parked"')),
}


def _cli_args(answer: dict[str, Any]) -> list[str]:
    args = []
    if "gate" in answer:
        args += ["--gate", str(answer["gate"])]
    if answer.get("done"):
        args.append("--done")
    if "data" in answer:
        args += ["--data", json.dumps(answer["data"])]
    return args


def _form(answer: dict[str, Any]) -> dict[str, str]:
    form = {"gate": str(answer.get("gate", "")), "data": ""}
    if answer.get("done"):
        form["done"] = "true"
    if "data" in answer:
        form["data"] = json.dumps(answer["data"])
    return form


@pytest.mark.parametrize("case", sorted(CASES))
async def test_every_path_gives_the_same_answer(db_url, table_prefix, make_store,
                                                case: str) -> None:
    answer, expected = CASES[case]
    url = parse_database_url(db_url)
    parker = Parker()
    async with AsyncClient(url, table_prefix) as client:
        await client.create_partition("p", [NewItem(path, b"{}") for path in PATHS])

        async def parked() -> bool:
            return len(await client.items("p", status="waiting")) == len(PATHS)
        async with running(Watcher(make_store(), parker, config())):
            await wait_until(parked, message="every item parked")
        # The processor is stopped: each item stays in the state its completion left.
        async with api_running(ApiOptions(url, table_prefix, port=0)) as api_url, \
                console_running(ConsoleOptions(url, table_prefix, port=0)) as console_url, \
                httpx.AsyncClient(timeout=30) as http:
            paths: dict[str, Callable[[], Awaitable[None]]] = {}

            async def by_client() -> None:
                await client.complete(parker.token("client"), **answer)

            async def by_cli() -> None:
                done = run_cli("complete", parker.token("cli"), *_cli_args(answer),
                               "--db-url", db_url, "--table-prefix", table_prefix)
                assert done.returncode == 0, (done.stdout, done.stderr)

            async def by_api() -> None:
                done = await http.post(f"{api_url}v1/completions/{parker.token('api')}",
                                       json=answer)
                assert done.status_code == 200, done.text

            async def by_console() -> None:
                page = await http.get(f"{console_url}item", params={"partition": "p",
                                                                    "id": "console"})
                for field in ('name="gate"', 'name="done"', 'name="data"'):
                    assert field in page.text, f"the Complete form has no {field}"
                csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
                assert csrf
                done = await http.post(f"{console_url}item/complete", data={
                    "partition": "p", "id": "console", "csrf": csrf.group(1),
                    **_form(answer)}, headers={"origin": console_url.rstrip("/")})
                assert done.status_code == 303, done.text
                assert "notice=completed" in done.headers["location"]

            paths.update(client=by_client, cli=by_cli, api=by_api, console=by_console)
            for path in PATHS:
                await paths[path]()
        items = {item.id: item for item in await client.items("p")}
    states = {path: (items[path].status, items[path].gate, items[path].data)
              for path in PATHS}
    assert states == dict.fromkeys(PATHS, expected), states
    # The same attempt count too: a completion is the answer of the call that parked.
    assert len({items[path].attempts for path in PATHS}) == 1


async def test_an_operator_gets_a_completion_url_from_the_shell(db_url, table_prefix,
                                                                 make_store) -> None:
    url = parse_database_url(db_url)
    where = ("--db-url", db_url, "--table-prefix", table_prefix)
    parker = Parker()
    async with AsyncClient(url, table_prefix) as client:
        await client.create_partition("p", [NewItem("a", b"{}")])

        async def parked() -> bool:
            return len(await client.items("p", status="waiting")) == 1
        async with running(Watcher(make_store(), parker, config())):
            await wait_until(parked, message="a parked")
        async with api_running(ApiOptions(url, table_prefix, port=0)) as api_url, \
                httpx.AsyncClient(timeout=30) as http:
            first = run_cli("waits", "token", "p", "a", *where)
            assert first.returncode == 0, first.stderr
            assert "/v1/completions/" in first.stdout and "--api-url" in first.stdout
            shown = run_cli("waits", "token", "p", "a", "--api-url", api_url, "--json",
                            *where)
            assert shown.returncode == 0, shown.stderr
            minted = json.loads(shown.stdout)
            assert minted["completion_url"] == (f"{api_url.rstrip('/')}/v1/completions/"
                                                f"{minted['completion_token']}")
            assert minted["completion_token"] != parker.token("a")
            done = await http.post(minted["completion_url"], json={"gate": 1})
            assert done.status_code == 200, done.text
            assert (done.json()["status"], done.json()["gate"]) == ("available", 1)
            late = await http.post(f"{api_url}v1/completions/{parker.token('a')}",
                                   json={"gate": 1})
            assert late.status_code == 409
        over = run_cli("waits", "token", "p", "a", *where)
        assert over.returncode == 2 and over.stderr.count("\n") == 1, over.stderr
        assert over.stdout == ""
