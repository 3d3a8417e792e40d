"""An operator asks the console for a waiting item's completion URL, on every live
database: a POST of the item page (the console's CSRF rules) mints a token for the same
wait and answers the page with the URL once, never cached; the URL completes the wait
through the API's real route, after which the handler's token is refused (409); asking
again invalidates the previous URL; a cross-site POST mints nothing; no token reaches a
log line or an address."""

from __future__ import annotations

import html
import logging
import re

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.console.app import create_app, settings_for
from processor.console.server import ConsoleOptions
from processor.observe.logs import formatter
from tests.integration.test_waits import Parker, config
from tests.support.engine import running, wait_until
from watcher import Watcher
from watcher.errors import ConfigError
from watcher.store.db.urls import parse_database_url

ORIGIN = "http://127.0.0.1:8090"
URL_FIELD = re.compile(r'id="completion-url" readonly value="([^"]+)"')


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match, "no CSRF token in the page"
    return match.group(1)


def _shown_url(page: str) -> str:
    match = URL_FIELD.search(page)
    assert match, "no completion URL in the page"
    return html.unescape(match.group(1))


async def test_an_operator_completion_url_completes_the_wait_once(
        db_url, table_prefix, make_store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")])
    url = parse_database_url(db_url)
    minted: list[str] = []
    addresses: list[str] = []
    async with running(Watcher(make_store(), parker, config())), \
            api_running(ApiOptions(url, table_prefix, port=0)) as api_url, \
            httpx.AsyncClient(timeout=30) as http, \
            AsyncClient(url, table_prefix) as console_client:
        async def parked() -> bool:
            return len(await client.items("p", status="waiting")) == 2
        await wait_until(parked, message="a and b parked")
        console = create_app(settings_for(url, table_prefix, host="127.0.0.1", port=8090,
                                          token=None, read_only=False, api_url=api_url),
                             console_client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console),
                                     base_url=ORIGIN) as web:
            page = (await web.get("/item?partition=p&id=a")).text
            assert 'id="show-completion-url"' in page and "/v1/completions/" not in page
            assert 'id="api-url-unset"' not in page, "the console knows the API's address"
            csrf = _csrf(page)
            form = {"partition": "p", "id": "a", "csrf": csrf}
            cross = await web.post("/item/completion-url", data=form,
                                   headers={"origin": "http://evil.example"})
            assert cross.status_code == 403 and "/v1/completions/" not in cross.text
            stale = await web.post("/item/completion-url", data={**form, "csrf": "0" * 32},
                                   headers={"origin": ORIGIN})
            assert stale.status_code == 403 and "/v1/completions/" not in stale.text

            first = await web.post("/item/completion-url", data=form,
                                   headers={"origin": ORIGIN})
            assert first.status_code == 200, first.text
            assert first.headers["cache-control"] == "no-store"
            first_url = _shown_url(first.text)
            assert first_url.startswith(f"{api_url.rstrip('/')}/v1/completions/")
            assert ">Completion URL</strong>" in first.text
            assert 'id="completion-url-note"' not in first.text
            second = await web.post("/item/completion-url", data=form,
                                    headers={"origin": ORIGIN})
            second_url = _shown_url(second.text)
            assert second_url != first_url, "asking again mints a new token"
            minted += [first_url.rsplit("/", 1)[1], second_url.rsplit("/", 1)[1]]
            assert parker.token("a") not in minted
            addresses += [str(response.url) for response in (cross, stale, first, second)]
            again = await web.get("/item?partition=p&id=a")
            assert "/v1/completions/" not in again.text, "shown once, in the POST's answer"

            replaced = await http.post(first_url, json={"gate": 1})
            assert replaced.status_code == 404, "the previous operator URL stops working"
            assert (await client.item("p", "a")).status == "waiting"
            done = await http.post(second_url, json={"gate": 1})
            assert done.status_code == 200, done.text
            assert done.json()["item_id"] == "a"
            handler = await http.post(f"{api_url}v1/completions/{parker.token('a')}",
                                      json={"gate": 1})
            assert handler.status_code == 409
            assert handler.json()["error"]["code"] == "already_completed"
            twice = await http.post(second_url, json={"gate": 1})
            assert twice.status_code == 409, "exactly once"

            over = await web.post("/item/completion-url", data=form,
                                  headers={"origin": ORIGIN})
            assert over.status_code == 303
            assert "notice=already-completed" in over.headers["location"]
            addresses.append(over.headers["location"])

            # The handler's token wins as well: the operator's is then refused.
            operator = _shown_url((await web.post("/item/completion-url", data={
                **form, "id": "b"}, headers={"origin": ORIGIN})).text)
            minted.append(operator.rsplit("/", 1)[1])
            by_handler = await http.post(f"{api_url}v1/completions/{parker.token('b')}",
                                         json={"gate": 1})
            assert by_handler.status_code == 200
            assert (await http.post(operator, json={"gate": 1})).status_code == 409
        info = await client.wait("p", timeout=30)
        assert info.status == "complete"
    await client.close()
    records = [record for record in caplog.records
               if not record.name.startswith(("httpx", "httpcore"))]
    assert any("action=operator_token_minted" in record.getMessage() for record in records)
    lines = [formatter(kind).format(record) for record in records for kind in ("text", "json")]
    for token in minted:
        for text in [*lines, *addresses]:
            assert token not in text


async def test_without_the_api_url_the_page_shows_the_path_and_says_so(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1")])
    url = parse_database_url(db_url)
    async with running(Watcher(make_store(), parker, config())):
        async def parked() -> bool:
            return len(await client.items("p", status="waiting")) == 1
        await wait_until(parked, message="a parked")
        console = create_app(settings_for(url, table_prefix, host="127.0.0.1", port=8090,
                                          token=None, read_only=False), client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console),
                                     base_url=ORIGIN) as web:
            page = (await web.get("/item?partition=p&id=a")).text
            # Before the button is pressed, the page says what it will show, and why.
            assert 'id="api-url-unset"' in page and "PROCESSOR_CONSOLE_API_URL" in page
            csrf = _csrf(page)
            shown = await web.post("/item/completion-url", headers={"origin": ORIGIN},
                                   data={"partition": "p", "id": "a", "csrf": csrf})
            path = _shown_url(shown.text)
            assert path.startswith("/v1/completions/") and 'id="completion-url-note"' in (
                shown.text)
            # Labelled as a path, never as a URL, with what to set next to it.
            assert ">Completion path (not a whole URL)</strong>" in shown.text
            assert ">Completion URL</strong>" not in shown.text
            note = shown.text.split('id="completion-url-note">', 1)[1].split("</p>", 1)[0]
            assert "--api-url" in note and "PROCESSOR_CONSOLE_API_URL" in note
            done = await client.complete(path.rsplit("/", 1)[1], gate=1)
            assert done.item_id == "a"
            missing = await web.post("/item/completion-url", headers={"origin": ORIGIN},
                                     data={"partition": "p", "id": "nothing", "csrf": csrf})
            assert "notice=not-waiting" in missing.headers["location"]
    await client.close()


@pytest.mark.parametrize("given", ["ftp://api.example.com", "api.example.com",
                                   "https://api.example.com/?x=1", "https://"])
def test_an_api_url_that_is_not_one_is_refused(given: str) -> None:
    with pytest.raises(ConfigError, match="--api-url"):
        ConsoleOptions(parse_database_url("sqlite:///x.db"), api_url=given)
    kept = ConsoleOptions(parse_database_url("sqlite:///x.db"),
                          api_url="https://api.example.com/statefeed/")
    assert kept.api_url == "https://api.example.com/statefeed"
