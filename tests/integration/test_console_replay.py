"""The item page's "Replay to…" form on every live database: the console in process, the
handler a real uvicorn server on loopback. The answer is shown beside the stored item and
nothing is written; "Replay and apply" writes it at the version the page showed; an item
that moved since the page was read, and a handler that is down, are said in one line with
nothing written; the form keeps the console's CSRF, same-origin and read-only rules."""

from __future__ import annotations

import html
import json

import handlers
from processor import AsyncClient, NewItem
from tests.integration.test_console import ORIGIN, _csrf, _web
from tests.support.servers import free_port, serve_app


def _answer(item: handlers.Item) -> handlers.Result:
    return handlers.Result(gate=1, data={"n": item.json()["n"] + 1, "tag": "<b>x</b>"})


async def test_replay_from_the_item_page(db_url: str, table_prefix: str) -> None:
    async with AsyncClient(db_url, table_prefix) as client, \
            _web(db_url, table_prefix, read_only=False) as web, \
            serve_app(handlers.app(_answer)) as handler_url:
        await client.create_partition("job", [NewItem("i0", b'{"n": 1}')])
        before = await client.item("job", "i0")
        page = (await web.get("/item", params={"partition": "job", "id": "i0"})).text
        assert 'id="replay-form"' in page
        form = {"partition": "job", "id": "i0", "csrf": _csrf(page), "url": handler_url,
                "version": str(before.version)}

        shown = await web.post("/item/replay", data=form, headers={"origin": ORIGIN})
        assert shown.status_code == 200, shown.text
        text = shown.text
        assert "HTTP 200" in text and 'id="replay-compare"' in text
        assert "the call the processor makes next for the item as stored (attempt 1" in \
            html.unescape(text)
        assert "X-Completion-Token: (hidden)" in text
        assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text  # escaped
        assert "Not written." in text
        assert (await client.item("job", "i0")).version == before.version

        applied = await web.post("/item/replay", data={**form, "apply": "yes"},
                                 headers={"origin": ORIGIN})
        assert applied.status_code == 200, applied.text
        assert "Written: the item is available at gate 1" in applied.text
        after = await client.item("job", "i0")
        assert (after.gate, after.version) == (1, before.version + 1)
        assert json.loads(after.data) == {"n": 2, "tag": "<b>x</b>"}

        # The page showed version `before`; the item moved since: refused, nothing written.
        stale = await web.post("/item/replay", data={**form, "apply": "yes"},
                               headers={"origin": ORIGIN})
        assert stale.status_code == 409
        assert "moved since it was read" in html.unescape(stale.text)
        assert (await client.item("job", "i0")).version == after.version

        down = await web.post("/item/replay",
                              data={**form, "version": str(after.version),
                                    "url": f"http://127.0.0.1:{free_port()}/", "apply": "yes"},
                              headers={"origin": ORIGIN})
        assert down.status_code == 409 and 'id="replay-problem"' in down.text
        assert "no answer: could not connect to" in down.text
        assert (await client.item("job", "i0")).version == after.version

        # The console's rules for actions hold: same origin and the session's CSRF token.
        assert (await web.post("/item/replay", data=form)).status_code == 403
        assert (await web.post("/item/replay", data={**form, "csrf": "0" * 32},
                               headers={"origin": ORIGIN})).status_code == 403


async def test_a_read_only_console_has_no_replay(db_url: str, table_prefix: str) -> None:
    async with AsyncClient(db_url, table_prefix) as client, \
            _web(db_url, table_prefix, read_only=True) as web:
        await client.create_partition("job", [NewItem("i0", b"{}")])
        page = (await web.get("/item", params={"partition": "job", "id": "i0"})).text
        assert 'id="replay-form"' not in page
        refused = await web.post("/item/replay", data={"partition": "job", "id": "i0",
                                                       "url": "http://127.0.0.1:9/"},
                                 headers={"origin": ORIGIN})
        assert refused.status_code == 403
