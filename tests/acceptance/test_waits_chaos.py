"""``processor api`` killed with ``kill -9`` in the middle of a stream of completions, on
every live database: after a restart, each completion was applied once or not at all,
a retry of any of them answers 200 (it had not applied) or 409 (it had), never applies
twice, and the gate passes once every item is completed."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import Processor, spawn
from tests.acceptance.test_api_upload import migrated  # noqa: F401 - the fixture
from tests.integration.test_waits import Parker, config
from tests.support.engine import running, wait_until
from watcher import Result, Store, Watcher

ITEMS = 300
CLIENTS = 16
# A deadline for a process to start or stop on a loaded machine, not a speed goal.
START_DEADLINE = 90.0


@pytest.fixture
async def started() -> AsyncIterator[list[Processor]]:
    """The processes a test starts (it appends each as it starts it): every one still
    running when the test ends, passed or failed, is killed and reaped."""
    processes: list[Processor] = []
    yield processes
    for proc in processes:
        proc.kill()
        with contextlib.suppress(AssertionError):
            await proc.wait(START_DEADLINE)


async def _api(tmp_path: Path, db_url: str, prefix: str, name: str,
               started: list[Processor]) -> tuple[Processor, str]:
    proc = await spawn(name, ["api", "--db-url", db_url, "--table-prefix", prefix,
                              "--port", "0"], tmp_path)
    started.append(proc)

    def announced() -> str | None:
        assert proc.running, proc.stderr()
        found = re.search(r"(http://127\.0\.0\.1:\d+/)v1/", proc.output())
        return found.group(1) if found else None

    return proc, await wait_until(announced, timeout=START_DEADLINE,
                                  message="the API's address")


async def _complete_all(url: str, tokens: list[str], outcomes: dict[str, list[object]],
                        stop_after: int | None = None, killed: asyncio.Event | None = None
                        ) -> None:
    queue = list(tokens)
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:

        async def worker() -> None:
            while queue:
                token = queue.pop()
                try:
                    answer = await http.post(f"v1/completions/{token}",
                                             json={"done": True, "data": {"by": "api"}})
                    outcomes[token].append(answer.status_code)
                except httpx.TransportError:
                    outcomes[token].append("cut")
                if killed is not None and killed.is_set():
                    return

        await asyncio.gather(*(worker() for _ in range(CLIENTS)))


async def test_a_kill_9_of_the_api_mid_completion_applies_each_once(
        migrated: tuple[str, str], tmp_path: Path,  # noqa: F811
        started: list[Processor]) -> None:
    db_url, prefix = migrated
    client = AsyncClient(db_url, prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem(f"i{n:04d}", b"1") for n in range(ITEMS)])
    store = Store.open(db_url, prefix)
    async with running(Watcher(store, parker, config(concurrency=64))):
        await wait_until(lambda: _all_waiting(client), timeout=60, message="all parked")
        tokens = [parker.token(item_id) for item_id in sorted(parker.tokens)]
        outcomes: dict[str, list[object]] = {token: [] for token in tokens}
        api, url = await _api(tmp_path, db_url, prefix, "api1", started)
        killed = asyncio.Event()

        async def kill_midway() -> None:
            await wait_until(lambda: sum(map(len, outcomes.values())) >= ITEMS // 3,
                             timeout=60, message="a third answered")
            api.kill()
            killed.set()

        await asyncio.gather(_complete_all(url, tokens, outcomes, killed=killed),
                             kill_midway())
        with contextlib.suppress(Exception):
            await api.wait(START_DEADLINE)
        assert 0 < sum(200 in seen for seen in outcomes.values()) < ITEMS, outcomes
        # After the restart, every token once more: 200 if it had not applied, else 409.
        again, url = await _api(tmp_path, db_url, prefix, "api2", started)
        retried: dict[str, list[object]] = {token: [] for token in tokens}
        await _complete_all(url, tokens, retried)
        info = await client.wait("p", timeout=60)
        code = await again.terminate(START_DEADLINE)
        assert code == 0, again.stderr()
    for token in tokens:
        (retry,) = retried[token]
        first = outcomes[token]
        assert retry in (200, 409), (first, retry)
        if 200 in first:
            assert retry == 409, "a completion that answered 200 is not applied again"
        assert [*first, retry].count(200) <= 1, (first, retry)
    assert info.status == "complete" and info.counts == {"complete": ITEMS}
    items = await client.items("p", limit=ITEMS)
    assert {item.data for item in items} == {b'{"by":"api"}'}, "each applied, once"
    await client.close()
    await store.close()


async def _all_waiting(client: AsyncClient) -> bool:
    return (await client.partition("p")).counts == {"waiting": ITEMS}


async def test_a_kill_9_of_the_processor_mid_completions_loses_none(
        migrated: tuple[str, str], tmp_path: Path,  # noqa: F811
        started: list[Processor]) -> None:
    """Completions arrive while the processor that parked the items dies with
    ``kill -9``: each applies once (none needs the processor), and another processor
    takes the partition once its lease ends and passes the gate."""
    import handlers
    from tests.acceptance.harness.processes import FAST
    from tests.integration.test_waits_http import Approvals
    from tests.support.servers import serve_app

    db_url, prefix = migrated
    approvals = Approvals()
    client = AsyncClient(db_url, prefix)
    store = Store.open(db_url, prefix)
    count = 120
    await client.create_partition("p", [NewItem(f"i{n:04d}", b"1") for n in range(count)])
    async with serve_app(handlers.app({0: approvals.ask, 1: approvals.done})) as url:
        args = ["run", "--handler-url", f"{url}/", "--db-url", db_url, "--table-prefix",
                prefix, *FAST]
        first = await spawn("k1", [*args, "--owner-id", "k1"], tmp_path)
        started.append(first)
        await wait_until(lambda: len(approvals.tokens) == count, timeout=60,
                         message="every item asked")
        await wait_until(lambda: _counts(client, count), timeout=60, message="all waiting")
        applied = 0
        for number, item_id in enumerate(sorted(approvals.tokens)):
            if number == count // 3:
                first.kill()
                await first.wait(START_DEADLINE)
                second = await spawn("k2", [*args, "--owner-id", "k2"], tmp_path)
                started.append(second)
            await store.wait_complete(approvals.token(item_id), Result(gate=1))
            applied += 1
        info = await client.wait("p", timeout=120)
        assert (await second.terminate(START_DEADLINE)) == 0, second.stderr()
    assert applied == count
    assert info.status == "complete" and info.counts == {"complete": count}
    for item_id in approvals.tokens:
        assert len(approvals.tokens[item_id]) == 1, "no item was asked twice"
    await client.close()
    await store.close()


async def _counts(client: AsyncClient, count: int) -> bool:
    return (await client.partition("p")).counts == {"waiting": count}
