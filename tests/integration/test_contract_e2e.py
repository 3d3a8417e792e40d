"""The HTTP handler contract end to end: a real Watcher and HttpProcessor against
raw-ASGI handlers served by uvicorn on loopback, on real SQLite and PostgreSQL.

Every test asserts on what the database ends up holding (items, partitions)
and on what the handler received (headers, bodies, attempts, timing).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from processor import AsyncClient, ItemInfo, NewItem, PartitionInfo
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.engine import running, wait_until
from tests.support.handler_apps import Request, read_request
from tests.support.servers import free_port, serve_app
from watcher import Watcher, WatcherConfig

# The lease is long enough that a loaded machine's stall (3 s once did it) cannot let it
# expire: an expired lease calls the items in flight again, which these tests count.
FAST = {"poll_interval": 0.05, "lease_duration": 9.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2, "shutdown_timeout": 5.0}
# The longest a handler holds a call open waiting for the test: a deadline, so a
# broken test fails instead of hanging.
HOLD_DEADLINE = 10.0
TOKEN = "Bearer s3cr3t-token"


# --------------------------------------------------------------------------- handler apps


@dataclass(frozen=True)
class Reply:
    """What the handler answers: status, body bytes and extra headers."""

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    declare_length: bool = True  # False: no Content-Length, the body is streamed (chunked)


def answer(payload: Any = None, status: int = 200, headers: tuple[tuple[str, str], ...] = ()
           ) -> Reply:
    """A JSON answer (``None``: an empty body)."""
    body = b"" if payload is None else json.dumps(payload).encode()
    return Reply(status, body, headers)


@dataclass
class Call(Request):
    """One request as the handler received it, and when."""

    at: float  # time.monotonic() on arrival
    n: int = 0  # 1-based count of calls for this item so far


Respond = Callable[[Call], Awaitable[Reply]]


@dataclass
class Handler:
    """A raw ASGI3 handler: records every call, then answers with ``respond(call)``."""

    respond: Respond
    calls: list[Call] = field(default_factory=list)

    def of(self, item_id: str, partition_id: str | None = None) -> list[Call]:
        """The calls for one item (of any partition, unless given), in arrival order."""
        return [call for call in self.calls if call.item_id == item_id
                and partition_id in (None, call.partition_id)]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        call = await read_request(scope, receive, Call, at=time.monotonic())
        call.n = 1 + len(self.of(call.item_id, call.partition_id))
        self.calls.append(call)
        reply = await self.respond(call)
        headers = [(b"content-type", b"application/json"),
                   *((k.encode(), v.encode()) for k, v in reply.headers)]
        if reply.declare_length:
            headers.append((b"content-length", str(len(reply.body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        if reply.declare_length:
            await send({"type": "http.response.body", "body": reply.body})
            return
        for start in range(0, len(reply.body), 512):
            await send({"type": "http.response.body", "body": reply.body[start:start + 512],
                        "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def hold(event: asyncio.Event) -> None:
    """Keep a call open until the test sets ``event`` (bounded by a deadline)."""
    await asyncio.wait_for(event.wait(), HOLD_DEADLINE)


# --------------------------------------------------------------------------- engine


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@contextlib.asynccontextmanager
async def engine(make_store: Callable[..., Any], handler_url: str, *, max_retries: int = 5,
                 **http_settings: Any) -> AsyncIterator[asyncio.Task[None]]:
    """A watcher dispatching through a real HttpProcessor; yields the watcher's task."""
    processor = HttpProcessor(HttpProcessorConfig(handler_url=handler_url, **http_settings))
    watcher = Watcher(make_store(), processor,
                      WatcherConfig(owner_id="w1", max_retries=max_retries, **FAST))
    try:
        async with running(watcher) as (task,):
            yield task
            assert not task.done(), "the watcher stopped by itself (crashed?)"
    finally:
        await processor.aclose()


@contextlib.asynccontextmanager
async def dispatching(make_store: Callable[..., Any], respond: Respond, *, max_retries: int = 5,
                      **http_settings: Any) -> AsyncIterator[Handler]:
    """Serve a :class:`Handler` answering with ``respond`` and run a watcher that
    dispatches to it (see :func:`engine`); yields the handler.
    """
    handler = Handler(respond)
    async with serve_app(handler) as url, engine(make_store, url + "/process",
                                                 max_retries=max_retries, **http_settings):
        yield handler


async def run_to_end(client: AsyncClient, make_store: Callable[..., Any], respond: Respond,
                     items: list[NewItem], **settings: Any) -> tuple[Handler, PartitionInfo]:
    """Create partition ``p`` with ``items`` and dispatch until it is complete or failed
    (see :func:`dispatching`); returns the handler and the partition.

    Raises:
        TimeoutError: the partition was still open after 10 s.
    """
    await client.create_partition("p", items)
    async with dispatching(make_store, respond, **settings) as handler:
        info = await client.wait("p", timeout=10)
    return handler, info


async def item_of(client: AsyncClient, partition_id: str, item_id: str) -> ItemInfo:
    return next(i for i in await client.items(partition_id) if i.id == item_id)


def by_id(items: list[ItemInfo]) -> dict[str, ItemInfo]:
    return {item.id: item for item in items}


def on_record(item: ItemInfo) -> str:
    """``item``'s last error, checked to be the newest entry of its error history (at its
    attempt and gate) and not to repeat its id: its row and history name the item."""
    assert item.last_error is not None and repr(item.id) not in item.last_error, item
    newest = item.error_history[-1]
    assert (newest.error, newest.attempt, newest.gate) == (
        item.last_error, item.attempts, item.gate), item
    return item.last_error


# --------------------------------------------------------------------------- 1. loops


async def test_a_loop_at_one_gate_runs_until_done(client, make_store) -> None:
    """``{}`` and ``{"data": n}`` keep the gate (a loop); ``done`` completes."""

    async def respond(call: Call) -> Reply:
        if call.n == 1:
            return answer({})
        if call.n == 2:
            return answer({"data": 2})
        return answer({"done": True})

    handler, info = await run_to_end(client, make_store, respond, [NewItem("a", b"start")])
    assert (info.status, info.gate, info.counts) == ("complete", 0, {"complete": 1})
    (item,) = await client.items("p")
    # The last answer carried no data: the bytes of the second answer stay.
    assert (item.status, item.gate, item.data, item.attempts, item.last_error) == (
        "complete", 0, b"2", 0, None)
    calls = handler.of("a")
    assert [c.body for c in calls] == [b"start", b"start", b"2"]
    assert [(c.gate, c.attempt) for c in calls] == [(0, 1)] * 3, "a loop is progress, no retry"
    assert len({c.key for c in calls}) == 3, "each loop round is a new step with a new key"


# --------------------------------------------------------------------------- 2. gates


async def test_gate_moves_and_jumps_and_the_partition_gate_follows(client, make_store) -> None:
    """a: 0 -> 5 -> done; b: 0 -> 2 -> 5 -> done. Gates 1, 3, 4 never run."""
    partition_gate_at_call: list[tuple[str, int, int]] = []

    async def respond(call: Call) -> Reply:
        info = await client.partition(call.partition_id)
        partition_gate_at_call.append((call.item_id, call.gate, info.gate))
        if call.gate == 0:
            return answer({"gate": 5 if call.item_id == "a" else 2})
        if call.gate == 2:
            return answer({"gate": 5})
        return answer({"done": True})

    handler, info = await run_to_end(
        client, make_store, respond, [NewItem("a", b""), NewItem("b", b"")])
    assert (info.status, info.gate, info.counts) == ("complete", 5, {"complete": 2})
    items = by_id(await client.items("p"))
    assert (items["a"].gate, items["b"].gate) == (5, 5)
    assert [c.gate for c in handler.of("a")] == [0, 5]
    assert [c.gate for c in handler.of("b")] == [0, 2, 5]
    # Fan-in: gates are handled strictly in order, so the sequence of gates is sorted.
    gates = [c.gate for c in handler.calls]
    assert gates == sorted(gates) and set(gates) == {0, 2, 5}
    # While an item is at gate g in flight, the partition sits at gate g.
    assert all(gate == seen for _, gate, seen in partition_gate_at_call), partition_gate_at_call
    assert all(c.attempt == 1 for c in handler.calls)


# --------------------------------------------------------------------------- 3. data


ORIGINAL = {"json": b"{\"raw\": 1}", "string": b"s", "null": b"n", "binary": b"b",
            "keep": b"\x00keep\xff"}


async def test_data_is_replaced_kept_or_decoded_from_base64(client, make_store) -> None:
    first_answers = {
        "json": {"gate": 1, "data": {"name": "Zoë", "scores": [1, 2.5], "ok": True,
                                     "none": None}},
        "string": {"gate": 1, "data": "plain text"},
        "null": {"gate": 1, "data": None},
        "binary": {"gate": 1, "data_b64": base64.b64encode(b"\x00\xff\x10bin").decode()},
        "keep": {"gate": 1},
    }
    expected = {
        # Compact JSON, UTF-8, key order kept.
        "json": '{"name":"Zoë","scores":[1,2.5],"ok":true,"none":null}'.encode(),
        "string": b'"plain text"',
        "null": b"null",
        "binary": b"\x00\xff\x10bin",
        "keep": b"\x00keep\xff",
    }

    async def respond(call: Call) -> Reply:
        if call.gate == 0:
            return answer(first_answers[call.item_id])
        return answer({"done": True})  # no data: keeps what gate 0 stored

    handler, info = await run_to_end(
        client, make_store, respond, [NewItem(k, v) for k, v in ORIGINAL.items()])
    assert (info.status, info.counts) == ("complete", {"complete": 5})
    items = by_id(await client.items("p"))
    assert {k: item.data for k, item in items.items()} == expected
    for item_id, data in expected.items():
        gate0, gate1 = handler.of(item_id)
        assert gate0.body == ORIGINAL[item_id]
        assert gate1.body == data, f"gate 1 of {item_id} got the stored bytes unchanged"


# --------------------------------------------------------------------------- 4. 500 then ok


async def test_a_500_is_retried_with_the_same_idempotency_key(client, make_store) -> None:
    second_call = asyncio.Event()
    release = asyncio.Event()

    async def respond(call: Call) -> Reply:
        if call.n == 1:
            return answer({"error": {"message": "database briefly down"}}, status=500)
        second_call.set()
        await hold(release)
        return answer({"done": True, "data": "ok"})

    await client.create_partition("p", [NewItem("a", b"payload")])
    async with dispatching(make_store, respond) as handler:
        await hold(second_call)
        # The retry is in flight: the failed attempt is on record meanwhile.
        during = await item_of(client, "p", "a")
        assert (during.status, during.attempts) == ("available", 1)
        assert "HTTP 500" in during.last_error and "database briefly down" in during.last_error
        on_record(during)
        release.set()
        info = await client.wait("p", timeout=10)
    assert info.status == "complete"
    item = await item_of(client, "p", "a")
    assert (item.status, item.attempts, item.last_error, item.data) == (
        "complete", 0, None, b'"ok"')
    first, second = handler.of("a")
    assert (first.attempt, second.attempt) == (1, 2)
    assert first.key == second.key, "a retry of the same step keeps its Idempotency-Key"
    assert first.body == second.body == b"payload"


# --------------------------------------------------------------------------- 5./6. final errors


async def test_no_retry_fails_the_item_at_once_and_the_partition(client, make_store) -> None:
    async def respond(call: Call) -> Reply:
        if call.item_id == "poison":
            # no_retry wins even on a status that is otherwise retried.
            return answer({"error": {"message": "poison pill detected", "no_retry": True}},
                          status=500)
        return answer({"done": True})

    handler, info = await run_to_end(
        client, make_store, respond, [NewItem("poison", b""), NewItem("ok", b"")])
    assert (info.status, info.gate) == ("failed", 0)
    items = by_id(await client.items("p"))
    poison = items["poison"]
    assert (poison.status, poison.attempts) == ("failed", 1)
    assert "poison pill detected" in on_record(poison)
    assert items["ok"].status == "complete"
    assert len(handler.of("poison")) == 1, "no_retry: called once only"


async def test_a_422_fails_the_item_at_once(client, make_store) -> None:
    async def respond(call: Call) -> Reply:
        return answer({"error": {"message": "schema mismatch in field 'x'"}}, status=422)

    handler, info = await run_to_end(client, make_store, respond, [NewItem("a", b"")])
    assert info.status == "failed"
    item = await item_of(client, "p", "a")
    assert (item.status, item.attempts) == ("failed", 1)
    assert "HTTP 422" in item.last_error and "schema mismatch in field 'x'" in item.last_error
    assert len(handler.calls) == 1


# --------------------------------------------------------------------------- 7. Retry-After


async def test_a_429_retry_after_is_honoured(client, make_store) -> None:
    """retry_backoff_max is 0.2 s: only Retry-After can make the retry wait ~1 s."""

    async def respond(call: Call) -> Reply:
        if call.n == 1:
            return answer({"error": "slow down"}, status=429, headers=(("Retry-After", "1"),))
        return answer({"done": True})

    handler, info = await run_to_end(client, make_store, respond, [NewItem("a", b"")])
    assert info.status == "complete"
    first, second = handler.of("a")
    gap = second.at - first.at
    assert gap >= 0.9, f"retried {gap:.3f} s after a 429 with Retry-After: 1"
    # A Retry-After holds the call back and uses no attempt: the retry is attempt 1 again.
    assert (first.attempt, second.attempt) == (1, 1) and first.key == second.key
    assert (await item_of(client, "p", "a")).attempts == 0


# --------------------------------------------------------------------------- 8. timeout


async def test_a_handler_timeout_is_retried(client, make_store) -> None:
    first_may_answer = asyncio.Event()
    second_call = asyncio.Event()
    second_may_answer = asyncio.Event()

    async def respond(call: Call) -> Reply:
        if call.n == 1:
            # Hangs past request_timeout; answers (into a closed connection) later.
            with contextlib.suppress(TimeoutError):
                await hold(first_may_answer)
            return answer({"done": True, "data": "too late"})
        second_call.set()
        await hold(second_may_answer)
        return answer({"done": True, "data": "in time"})

    await client.create_partition("p", [NewItem("a", b"x")])
    try:
        # 1 s, not less: the second call must outlast the test's read of the item
        # in between on a loaded machine, or it times out too and a third call comes.
        async with dispatching(make_store, respond, request_timeout=1.0) as handler:
            await hold(second_call)
            first_may_answer.set()  # its connection is closed already: the answer is lost
            during = await item_of(client, "p", "a")
            assert (during.status, during.attempts) == ("available", 1)
            assert "request_timeout" in during.last_error and "1.0 s" in during.last_error
            on_record(during)
            second_may_answer.set()
            info = await client.wait("p", timeout=10)
    finally:
        first_may_answer.set()
        second_may_answer.set()
    assert info.status == "complete"
    item = await item_of(client, "p", "a")
    assert (item.data, item.attempts, item.last_error) == (b'"in time"', 0, None)
    first, second = handler.of("a")
    assert (first.attempt, second.attempt) == (1, 2) and first.key == second.key
    # 1 s timeout plus at least 0.025 s of backoff (less a little for the request's
    # trip to the handler).
    assert second.at - first.at >= 0.98, "the retry came only after the timeout"


# --------------------------------------------------------------------------- 9. handler down


async def test_a_handler_down_at_start_spends_no_attempt_until_it_comes_up(
        client, make_store, caplog) -> None:
    async def respond(call: Call) -> Reply:
        return answer({"done": True})

    caplog.set_level(logging.WARNING, logger="watcher.flow.handler_hold")
    handler = Handler(respond)
    port = free_port()  # nothing listens here yet
    await client.create_partition("p", [NewItem("a", b"")])
    async with engine(make_store, f"http://127.0.0.1:{port}/process", max_retries=0):
        await wait_until(lambda: "action=handler_hold_started" in caplog.text, timeout=10,
                         message="the calls held for the refused connection")
        assert "could not connect" in caplog.text
        down = await item_of(client, "p", "a")
        assert (down.status, down.attempts) == ("available", 0), "an outage spends no attempt"
        assert (await client.partition("p")).status == "available"
        async with serve_app(handler, port=port):
            info = await client.wait("p", timeout=30)
    assert info.status == "complete"  # with max_retries=0, an attempt spent would fail it
    item = await item_of(client, "p", "a")
    assert (item.status, item.attempts, item.last_error) == ("complete", 0, None)
    # The probes are GETs without an item; the item's one call came once it answered.
    (call,) = [call for call in handler.calls if call.item_id == "a"]
    assert call.attempt == 1, "the refused calls were no attempts"


# --------------------------------------------------------------------------- 10. malformed


BAD = "resume-bad-7"
OVERSIZED = json.dumps({"done": True, "pad": "x" * 2048}).encode()
TOO_LARGE = "larger than max_response_bytes (1024 bytes)"
MALFORMED: dict[str, tuple[Reply, str]] = {
    "invalid_json": (Reply(body=b'{"done": tru'), "not valid JSON"),
    "gate_string": (Reply(body=b'{"gate": "1"}'), "'gate' must be a non-negative integer"),
    "done_string": (Reply(body=b'{"done": "yes"}'), "'done' must be true or false"),
    "over_size_limit_declared": (Reply(body=OVERSIZED), TOO_LARGE),
    "over_size_limit_streamed": (Reply(body=OVERSIZED, declare_length=False), TOO_LARGE),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
async def test_a_malformed_answer_is_retried_then_fails_without_stalling_the_partition(
        client, make_store, caplog, kind: str) -> None:
    caplog.set_level(logging.INFO)
    bad_reply, problem = MALFORMED[kind]
    bad_called_twice = asyncio.Event()
    last_try = asyncio.Event()

    async def respond(call: Call) -> Reply:
        if call.item_id == BAD:
            if call.n == 2:
                bad_called_twice.set()
            if call.n == 3:
                await hold(last_try)
            return bad_reply
        if call.n == 1:
            # Good items are still in flight when the bad item's first answer is
            # applied, and are dispatched again after it.
            await hold(bad_called_twice)
            return answer({})
        return answer({"done": True})

    good = [f"good-{n}" for n in range(3)]
    await client.create_partition("p", [NewItem(BAD, b""), *(NewItem(g, b"") for g in good)])
    async with dispatching(make_store, respond, max_retries=2,
                           max_response_bytes=1024) as handler:

        async def goods_done_bad_retrying() -> dict[str, ItemInfo] | None:
            items = by_id(await client.items("p"))
            if all(items[g].status == "complete" for g in good) and items[BAD].attempts == 2:
                return items
            return None

        items = await wait_until(goods_done_bad_retrying, timeout=10,
                                 message="good items complete while the bad one retries")
        bad = items[BAD]
        assert bad.status == "available", "a malformed answer is retryable"
        assert problem in on_record(bad), bad.last_error
        assert (await client.partition("p")).status == "available"
        last_try.set()
        info = await client.wait("p", timeout=10)
    assert (info.status, info.gate) == ("failed", 0)
    items = by_id(await client.items("p"))
    assert (items[BAD].status, items[BAD].attempts) == ("failed", 3)
    assert problem in on_record(items[BAD])
    assert all(items[g].status == "complete" for g in good)
    assert [c.attempt for c in handler.of(BAD)] == [1, 2, 3]
    assert all(len(handler.of(g)) == 2 for g in good)
    # Nothing crashed: the one ERROR is the partition's failure, with its reason.
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(
        "action=partition_closed partition=p pipeline=default status=failed gate=0 reason=item "
        f"failed_items=1 item={BAD} attempts=3 error="), errors


# --------------------------------------------------------------------------- 11. gate below


async def test_a_gate_below_the_partition_gate_is_rejected_for_good(client, make_store) -> None:
    async def respond(call: Call) -> Reply:
        if call.gate == 0:
            return answer({"gate": 3})
        if call.item_id == "x":
            return answer({"gate": 1})  # the partition is at gate 3 by now
        return answer({"done": True})

    handler, info = await run_to_end(
        client, make_store, respond, [NewItem("x", b"x0"), NewItem("y", b"")])
    assert (info.status, info.gate) == ("failed", 3)
    items = by_id(await client.items("p"))
    x = items["x"]
    assert (x.status, x.gate, x.attempts, x.data) == ("failed", 3, 1, b"x0")
    assert "gate 1" in on_record(x)
    assert "the partition is at gate 3" in x.last_error
    assert "below its partition's gate" in x.last_error
    assert [c.gate for c in handler.of("x")] == [0, 3], "not retried"
    assert items["y"].status == "complete"


# --------------------------------------------------------------------------- 12. headers


async def test_the_handler_receives_the_contract_headers_and_the_token_never_leaks(
        client, make_store, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    body = b"\x00\x01binary\r\n\xffbody"
    doc_retried = asyncio.Event()
    release_doc = asyncio.Event()

    async def respond(call: Call) -> Reply:
        auth = call.header("authorization") or ""
        echoed = f"rejected {auth} (token {auth.partition(' ')[2]})"
        if call.partition_id == "tenant-8":
            return answer({"error": {"message": echoed}}, status=403)
        if call.n == 1:
            return answer({"error": {"message": echoed}}, status=500)
        if call.item_id == "doc-1":
            doc_retried.set()
            await hold(release_doc)
        return answer({"done": True})

    odd_id = "résumé 2/ü%"
    await client.create_partition("tenant-7", [NewItem("doc-1", body), NewItem(odd_id, b"")])
    await client.create_partition("tenant-8", [NewItem("poison", b"")])
    async with dispatching(make_store, respond, headers={"Authorization": TOKEN}) as handler:
        await hold(doc_retried)
        retrying = await item_of(client, "tenant-7", "doc-1")
        release_doc.set()
        assert (await client.wait("tenant-7", timeout=10)).status == "complete"
        assert (await client.wait("tenant-8", timeout=10)).status == "failed"

    first, second = handler.of("doc-1")
    for call in (first, second):
        assert call.header("x-partition-id") == "tenant-7"
        assert call.header("x-item-id") == "doc-1"
        assert call.header("x-gate") == "0"
        assert call.header("content-type") == "application/octet-stream"
        assert call.header("authorization") == TOKEN
        assert call.body == body
    assert (first.header("x-attempt"), second.header("x-attempt")) == ("1", "2")
    assert first.header("idempotency-key") == second.header("idempotency-key")
    assert len(first.key) >= 16 and first.key.isascii()
    # An id that is not plain visible ASCII arrives percent-encoded and decodes back.
    odd = handler.of(odd_id)[0]
    assert "%" in (odd.header("x-item-id") or "") and odd.header("x-item-id") != odd_id
    assert odd.header("x-partition-id") == "tenant-7"

    # The handler echoed the token into its error messages: the DB keeps the message
    # with the token masked, both while retrying and once failed...
    poison = await item_of(client, "tenant-8", "poison")
    assert (poison.status, retrying.status, retrying.attempts) == ("failed", "available", 1)
    assert "HTTP 403" in poison.last_error and "HTTP 500" in retrying.last_error
    errors = [retrying.last_error, poison.last_error]
    for text in errors:
        assert "rejected *** (token ***)" in text, "the message is kept, the token masked"
    for partition_id in ("tenant-7", "tenant-8"):
        errors += [i.last_error for i in await client.items(partition_id) if i.last_error]
    # ...and no log line of the run, at any level, carries it.
    assert any(r.name.startswith("processor") for r in caplog.records), "debug logs were captured"
    assert any("handler_call_failed" in r.getMessage() for r in caplog.records)
    token_only = TOKEN.partition(" ")[2]
    for text in [caplog.text, *(r.getMessage() for r in caplog.records), *errors]:
        assert token_only not in text, text


async def test_a_token_cut_by_error_message_truncation_does_not_leak_in_part(
        client, make_store) -> None:
    """A handler echoing the token right at the 1000-character message limit."""
    token_only = TOKEN.partition(" ")[2]

    async def respond(call: Call) -> Reply:
        auth = call.header("authorization") or ""
        # The limit falls on the token's last character.
        pad = "x" * (1000 - len(auth) + 1)
        return answer({"error": {"message": pad + auth}}, status=403)

    _, info = await run_to_end(client, make_store, respond, [NewItem("a", b"")],
                               headers={"Authorization": TOKEN})
    assert info.status == "failed"
    item = await item_of(client, "p", "a")
    assert "HTTP 403" in item.last_error and "xxxx" in item.last_error
    assert token_only[:-1] not in item.last_error, item.last_error
