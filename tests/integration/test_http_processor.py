"""HttpProcessor against real uvicorn-served handlers (and raw TCP servers) on loopback."""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pytest

from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.servers import free_port, serve_app
from watcher.protocol import (
    HandlerUnavailableError,
    NonRetryableError,
    Result,
    RetryableError,
    WorkItem,
)

TOKEN = "Bearer s3cr3t-t0ken-never-shown"
PASSWORD = "hunter2-pass"

Reply = tuple[int, list[tuple[bytes, bytes]], bytes]


@dataclass
class Seen:
    """One request as the handler saw it."""

    method: str
    path: str
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes
    client_port: int

    def header(self, name: str) -> str | None:
        values = [v.decode("latin-1") for k, v in self.raw_headers if k.decode() == name.lower()]
        assert len(values) <= 1, f"header {name} sent {len(values)} times"
        return values[0] if values else None


@dataclass
class HandlerApp:
    """A raw ASGI3 handler: records each request and answers with ``respond``."""

    respond: Callable[[Seen], Awaitable[Reply]] | None = None
    requests: list[Seen] = field(default_factory=list)
    url: str = ""

    def reply(self, status: int = 200, body: bytes | dict | list = b"",
              headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Answer every request with this fixed response."""
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()

        async def fixed(_: Seen) -> Reply:
            return status, list(headers or []), payload

        self.respond = fixed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        seen = Seen(scope["method"], scope["path"], list(scope["headers"]), body,
                    scope["client"][1])
        self.requests.append(seen)
        assert self.respond is not None, "test forgot to set a reply"
        status, headers, payload = await self.respond(seen)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(payload)).encode()), *headers]})
        await send({"type": "http.response.body", "body": payload})


def make_item(**changes: Any) -> WorkItem:
    values: dict[str, Any] = {
        "partition_id": "p-1", "id": "item-1", "gate": 3, "attempt": 2,
        "data": b"\x00\x01payload\xff", "version": 7, "idempotency_key": "p-1:item-1:3:7",
    }
    values.update(changes)
    return WorkItem(**values)


def assert_names_no_item(error: BaseException) -> None:
    """The error is the handler's failure alone: the engine keeps it with the item's row,
    error history and log fields, which name the partition, item, gate and attempt."""
    text = str(error)
    assert text, "an error says what went wrong"
    for context in ("p-1", "item-1", "gate 3", "attempt"):
        assert context not in text, (context, text)


@pytest.fixture
async def handler() -> AsyncIterator[HandlerApp]:
    app = HandlerApp()
    async with serve_app(app) as url:
        app.url = url + "/process"
        yield app


@pytest.fixture
async def make_processor() -> AsyncIterator[Callable[..., HttpProcessor]]:
    opened: list[HttpProcessor] = []

    def make(url: str, **settings: Any) -> HttpProcessor:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url, **settings))
        opened.append(processor)
        return processor

    yield make
    for processor in opened:
        await processor.aclose()


# --------------------------------------------------------------------------- request


async def test_request_carries_the_item_bytes_and_contract_headers(handler, make_processor):
    handler.reply(200, {})
    processor = make_processor(handler.url, headers={"Authorization": TOKEN, "X-Tenant": "acme"})

    await processor.process(make_item())

    [seen] = handler.requests
    assert (seen.method, seen.path) == ("POST", "/process")
    assert seen.body == b"\x00\x01payload\xff"
    assert seen.header("content-type") == "application/octet-stream"
    assert seen.header("content-length") == str(len(seen.body))
    assert seen.header("x-partition-id") == "p-1"
    assert seen.header("x-item-id") == "item-1"
    assert seen.header("x-gate") == "3"
    assert seen.header("x-attempt") == "2"
    assert seen.header("idempotency-key") == "p-1:item-1:3:7"
    assert seen.header("authorization") == TOKEN
    assert seen.header("x-tenant") == "acme"


async def test_empty_item_data_is_sent_as_an_empty_body(handler, make_processor):
    handler.reply(200, b"")
    await make_processor(handler.url).process(make_item(data=b""))
    [seen] = handler.requests
    assert seen.body == b"" and seen.header("content-length") == "0"


@pytest.mark.parametrize("raw_id, expected", [
    ("plain-ID_1/x:y", "plain-ID_1/x:y"),          # visible ASCII: as is
    ("café au lait", "caf%C3%A9%20au%20lait"),       # non-ASCII and spaces: encoded
    ("100%", "100%25"),                               # '%' alone forces encoding
    ("line\nbreak", "line%0Abreak"),
    ("", ""),
])
async def test_ids_that_are_not_plain_visible_ascii_are_percent_encoded(
        handler, make_processor, raw_id, expected):
    handler.reply(200, b"")
    item = make_item(partition_id=raw_id, id=raw_id, idempotency_key=raw_id)
    await make_processor(handler.url).process(item)
    [seen] = handler.requests
    for name in ("x-partition-id", "x-item-id", "idempotency-key"):
        assert seen.header(name) == expected
        assert unquote(seen.header(name)) == raw_id


async def test_userinfo_in_the_url_becomes_basic_auth_and_stays_out_of_the_request_url(
        handler, make_processor):
    handler.reply(200, b"")
    url = handler.url.replace("http://", f"http://bob:{PASSWORD}@")
    await make_processor(url).process(make_item())
    [seen] = handler.requests
    scheme, _, token = seen.header("authorization").partition(" ")
    assert scheme == "Basic" and base64.b64decode(token) == f"bob:{PASSWORD}".encode()


# --------------------------------------------------------------------------- success


@pytest.mark.parametrize("status, body, expected", [
    (200, {"gate": 5, "done": True, "data": {"k": "é", "n": [1, 2]}},
     Result(gate=5, done=True, data='{"k":"é","n":[1,2]}'.encode())),
    (200, {"gate": 4}, Result(gate=4, done=False, data=None)),
    (200, {"done": True}, Result(gate=None, done=True, data=None)),
    (200, {"data": None}, Result(data=b"null")),
    (200, {"data": "text"}, Result(data=b'"text"')),
    (201, {"data_b64": base64.b64encode(b"\x00\xffbin").decode()}, Result(data=b"\x00\xffbin")),
    (200, {"gate": 0, "extra": "ignored"}, Result(gate=0)),
    (200, {}, Result()),
    (200, b"", Result()),
    (204, b"", Result()),
])
async def test_success_answers_map_to_results(handler, make_processor, status, body, expected):
    handler.reply(status, body)
    assert await make_processor(handler.url).process(make_item()) == expected


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("status, body, error_type, in_message", [
    (500, {"error": {"message": "database down"}}, RetryableError, "HTTP 500: database down"),
    (500, {"error": {"message": "bad input", "no_retry": True}}, NonRetryableError,
     "no_retry"),
    (502, b"<html><body>Bad Gateway</body></html>", HandlerUnavailableError, "Bad Gateway"),
    (500, b"Internal Server Error", RetryableError, "HTTP 500"),
    (400, {"error": {"message": "missing field"}}, NonRetryableError, "missing field"),
    (404, b"", NonRetryableError, "HTTP 404"),
    (422, {"error": "not a number"}, NonRetryableError, "not a number"),
    (408, b"", RetryableError, "HTTP 408"),
    (200, {"error": {"message": "try later"}}, RetryableError, "reported an error"),
    (301, b"", NonRetryableError, "redirects are not followed"),
])
async def test_error_answers_are_classified(handler, make_processor, status, body, error_type,
                                           in_message):
    handler.reply(status, body)
    with pytest.raises(error_type) as caught:
        await make_processor(handler.url).process(make_item())
    assert type(caught.value) is error_type
    assert in_message in str(caught.value)
    assert_names_no_item(caught.value)


@pytest.mark.parametrize("status", [429, 503])
async def test_retry_after_in_seconds_is_honoured(handler, make_processor, status):
    handler.reply(status, b"", headers=[(b"retry-after", b"7")])
    with pytest.raises(RetryableError) as caught:
        await make_processor(handler.url).process(make_item())
    assert caught.value.retry_after == 7.0


@pytest.mark.parametrize("status", [429, 503])
async def test_retry_after_as_an_http_date_is_honoured(handler, make_processor, status):
    when = email.utils.formatdate(time.time() + 120, usegmt=True).encode()
    handler.reply(status, b"", headers=[(b"retry-after", when)])
    with pytest.raises(RetryableError) as caught:
        await make_processor(handler.url).process(make_item())
    assert 100 < caught.value.retry_after <= 121


async def test_retry_after_is_ignored_on_other_statuses(handler, make_processor):
    handler.reply(500, b"", headers=[(b"retry-after", b"7")])
    with pytest.raises(RetryableError) as caught:
        await make_processor(handler.url).process(make_item())
    assert caught.value.retry_after is None


async def test_a_handler_slower_than_request_timeout_is_a_retryable_timeout(
        handler, make_processor):
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def stall(_: Seen) -> Reply:
        arrived.set()
        await release.wait()
        return 200, [], b"{}"

    handler.respond = stall
    # Long enough for the request to reach a handler in the same event loop on a busy
    # machine (0.3 s was not, under the CI's load), so the timeout is the handler's.
    request_timeout = 1.5
    processor = make_processor(handler.url, request_timeout=request_timeout)
    started = time.monotonic()
    try:
        with pytest.raises(RetryableError) as caught:
            await processor.process(make_item())
    finally:
        release.set()
    assert arrived.is_set()
    # The call ended at its timeout (the handler never answers): a bound derived from
    # it, with a loaded machine's margin.
    assert time.monotonic() - started < request_timeout * 4
    assert "request_timeout" in str(caught.value)
    assert_names_no_item(caught.value)


async def test_connection_refused_is_retryable(make_processor):
    processor = make_processor(f"http://127.0.0.1:{free_port()}/process")
    with pytest.raises(RetryableError) as caught:
        await processor.process(make_item())
    assert "could not connect" in str(caught.value)
    assert_names_no_item(caught.value)


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize("body, in_message", [
    (b"{not json", "not valid JSON"),
    (b'{"gate": NaN}', "not valid JSON"),
    (b'{"data": 1e999}', "1e999 overflows a 64-bit float"),
    (b'{"gate": "1"}', "'gate' must be a non-negative integer"),
    (b'{"gate": true}', "'gate' must be a non-negative integer"),
    (b'{"gate": 1.0}', "'gate' must be a non-negative integer"),
    (b'{"gate": -1}', "'gate' must be a non-negative integer"),
    (b'{"done": "yes"}', "'done' must be true or false"),
    (b'{"data": 1, "data_b64": "AA=="}', "both 'data' and 'data_b64'"),
    (b'{"data_b64": "not base64!"}', "'data_b64' is not valid base64"),
    (b'{"data_b64": 12}', "'data_b64' must be a base64 string"),
    (b"[1, 2]", "JSON array, not an object"),
    (b'"text"', "JSON string, not an object"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"data": "' + b"x" * 200 + b'"}', "larger than max_response_bytes (100 bytes)"),
])
async def test_malformed_success_answers_are_retryable_errors_saying_why(
        handler, make_processor, body, in_message):
    handler.reply(200, body)
    processor = make_processor(handler.url, max_response_bytes=100 if b"x" * 200 in body
                               else 1_000_000)
    with pytest.raises(RetryableError) as caught:
        await processor.process(make_item())
    assert in_message in str(caught.value)
    assert "malformed answer" in str(caught.value)
    assert_names_no_item(caught.value)


async def test_an_endless_body_is_cut_off_at_the_limit_without_buffering_it():
    """A handler streaming forever: the call must end (with an error) soon after the limit."""
    disconnected = asyncio.Event()
    sent = 0

    async def endless(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal sent
        if scope["type"] != "http":
            return
        await receive()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.create_task(watch())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        chunk = b" " * 65536
        while not disconnected.is_set() and sent < 2**32:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent += len(chunk)
            await asyncio.sleep(0)
        watcher.cancel()

    async with serve_app(endless) as url:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=url, max_response_bytes=4096))
        async with processor, asyncio.timeout(10):
            with pytest.raises(RetryableError) as caught:
                await processor.process(make_item())
            await disconnected.wait()
    assert "larger than max_response_bytes (4096 bytes)" in str(caught.value)
    assert_names_no_item(caught.value)
    assert sent < 2**32


async def test_a_declared_oversized_body_is_refused_before_reading_it(handler, make_processor):
    release = asyncio.Event()

    async def huge(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"1000000000")]})
        await release.wait()  # never sends the body: reading it would time out

    async with serve_app(huge) as url:
        processor = make_processor(url, max_response_bytes=1000, request_timeout=5)
        try:
            with pytest.raises(RetryableError) as caught:
                await processor.process(make_item())
        finally:
            release.set()
    assert "larger than max_response_bytes" in str(caught.value)


async def test_an_oversized_error_body_still_classifies_by_status(handler, make_processor):
    handler.reply(404, b"x" * 5000)
    with pytest.raises(NonRetryableError) as caught:
        await make_processor(handler.url, max_response_bytes=1000).process(make_item())
    assert "HTTP 404" in str(caught.value) and "larger than 1000 bytes" in str(caught.value)


# --------------------------------------------------------------------------- secrets


async def test_secrets_never_appear_in_messages_reprs_or_logs(handler, make_processor, caplog):
    caplog.set_level(logging.DEBUG)
    token_only = TOKEN.split()[1]

    async def echo(seen: Seen) -> Reply:
        auth = seen.header("authorization")
        body = {"error": {"message": f"rejected {auth} (token {auth.split()[1]})"}}
        return 500, [], json.dumps(body).encode()

    handler.respond = echo
    config = HttpProcessorConfig(handler_url=handler.url,
                                 headers={"Authorization": TOKEN, "X-Api-Key": "k3y-value-123"})
    processor = make_processor(handler.url, headers=dict(config.headers))
    with pytest.raises(RetryableError) as caught:
        await processor.process(make_item())

    refused_url = f"http://bob:{PASSWORD}@127.0.0.1:{free_port()}/p?code=query-secret-1"
    with_password = make_processor(refused_url)
    with pytest.raises(RetryableError) as refused:
        await with_password.process(make_item())

    texts = [str(caught.value), repr(caught.value), repr(processor), repr(config), str(config),
             str(refused.value), repr(with_password), repr(with_password.config),
             caplog.text, *(r.getMessage() for r in caplog.records)]
    for text in texts:
        for secret in (TOKEN, token_only, "k3y-value-123", PASSWORD, "query-secret-1"):
            assert secret not in text, (secret, text)
    assert "rejected ***" in str(caught.value)  # the message itself is kept
    assert "bob:***@127.0.0.1" in str(refused.value)
    assert "Authorization" in repr(processor) and "X-Api-Key" in repr(config)
    # Item calls bypass httpx's client (and its request log); our own lines were captured.
    assert any(r.name.startswith("processor") for r in caplog.records)


# --------------------------------------------------------------------------- pool, robustness


async def test_sequential_calls_reuse_one_keep_alive_connection(handler, make_processor):
    handler.reply(200, b"")
    processor = make_processor(handler.url)
    for _ in range(3):
        await processor.process(make_item())
    assert len({seen.client_port for seen in handler.requests}) == 1


async def test_concurrent_calls_share_a_bounded_pool(handler, make_processor):
    in_flight = 0
    most = 0

    async def counted(seen: Seen) -> Reply:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)  # keep the connection busy so others must queue
        in_flight -= 1
        return 200, [], json.dumps({"gate": int(seen.header("x-gate")) + 1}).encode()

    handler.respond = counted
    processor = make_processor(handler.url, max_connections=4)
    results = await asyncio.gather(*(processor.process(make_item(gate=g)) for g in range(20)))
    assert [r.gate for r in results] == list(range(1, 21))
    assert most <= 4
    assert len({seen.client_port for seen in handler.requests}) <= 4


async def test_an_unexpected_failure_is_mapped_to_a_retryable_error(handler, make_processor):
    handler.reply(200, b"")
    with pytest.raises(RetryableError) as caught:
        await make_processor(handler.url).process(make_item(id="bad\ud800surrogate"))
    assert "UnicodeEncodeError" in str(caught.value)
    assert not handler.requests


async def test_a_closed_processor_fails_calls_as_retryable(handler):
    handler.reply(200, b"")
    async with HttpProcessor(HttpProcessorConfig(handler_url=handler.url)) as processor:
        assert await processor.process(make_item()) == Result()
    with pytest.raises(RetryableError) as caught:
        await processor.process(make_item())
    assert "closed" in str(caught.value)
    await processor.aclose()  # a second close is harmless


@dataclass
class RawServer:
    """A raw HTTP/1.1 server: ``plan(connection_no, request_no_on_connection)`` says
    whether to answer (True) or drop the connection without answering (False)."""

    plan: Callable[[int, int], bool]
    connections: int = 0
    requests: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection_no = self.connections
        request_no = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.requests += 1
                request_no += 1
                if not self.plan(connection_no, request_no):
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{\"gate\":9}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Callable[[int, int], bool]], Any]]:
    servers: list[asyncio.Server] = []

    async def start(plan: Callable[[int, int], bool]) -> tuple[RawServer, str]:
        raw = RawServer(plan)
        server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
        servers.append(server)
        return raw, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_a_keep_alive_connection_dropped_by_the_server_is_retried_once(
        raw_server, make_processor):
    # Connection 1 answers its first request, then drops the second one unanswered
    # (the server closed an idle keep-alive connection as we reused it).
    raw, url = await raw_server(lambda conn, req: not (conn == 1 and req == 2))
    processor = make_processor(url)
    assert await processor.process(make_item()) == Result(gate=9)
    assert await processor.process(make_item()) == Result(gate=9)
    assert (raw.connections, raw.requests) == (2, 3)


async def test_a_handler_that_always_drops_the_connection_fails_after_one_retry(
        raw_server, make_processor):
    raw, url = await raw_server(lambda conn, req: False)
    with pytest.raises(RetryableError) as caught:
        await make_processor(url).process(make_item())
    assert raw.requests == 2
    assert_names_no_item(caught.value)


# --------------------------------------------------------------------------- health


async def test_health_check_is_ok_on_2xx_and_not_ok_otherwise(handler, make_processor):
    health_url = handler.url.replace("/process", "/healthz")
    processor = make_processor(handler.url, health_url=health_url,
                               headers={"Authorization": TOKEN})
    handler.reply(200, b"ok")
    ok, detail = await processor.check_health()
    assert ok and "HTTP 200" in detail
    [seen] = handler.requests
    assert (seen.method, seen.path) == ("GET", "/healthz")
    assert seen.header("authorization") == TOKEN
    handler.reply(503, b"")
    ok, detail = await processor.check_health()
    assert not ok and "HTTP 503" in detail


async def test_health_check_reports_an_unreachable_handler(make_processor):
    port = free_port()
    processor = make_processor(f"http://127.0.0.1:{port}/p",
                               health_url=f"http://127.0.0.1:{port}/healthz")
    ok, detail = await processor.check_health()
    assert not ok and "ConnectError" in detail


async def test_health_check_without_a_health_url_is_ok(make_processor):
    ok, _ = await make_processor(f"http://127.0.0.1:{free_port()}/p").check_health()
    assert ok
