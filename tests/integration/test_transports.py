"""Both HTTP transports behave the same through the processor: answers and failures."""

from __future__ import annotations

import asyncio

import pytest

from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from tests.support.servers import free_port, read_body, serve_app
from watcher.protocol import Result, RetryableError, WorkItem

ITEM = WorkItem("p", "i", 0, 1, b"payload", 1, "key")
RELEASE: dict[str, asyncio.Event] = {}


async def answer(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    if body == b"hang":
        await RELEASE["hang"].wait()  # holds the answer until the test saw its timeout
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"gate": 2, "data": "ok"}'})


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request) -> str:
    return request.param


async def test_success(transport) -> None:
    async with serve_app(answer) as url:
        async with HttpProcessor(HttpProcessorConfig(handler_url=url,
                                                     transport=transport)) as http:
            results = await asyncio.gather(*(http.process(ITEM) for _ in range(20)))
    assert set(results) == {Result(gate=2, data=b'"ok"')}


async def test_connection_refused_is_named(transport) -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    async with HttpProcessor(HttpProcessorConfig(handler_url=url, transport=transport)) as http:
        with pytest.raises(RetryableError, match="could not connect to"):
            await http.process(ITEM)
    health = f"http://127.0.0.1:{free_port()}/healthz"
    async with HttpProcessor(HttpProcessorConfig(handler_url=url, transport=transport,
                                                 health_url=health)) as http:
        ok, detail = await http.check_health()
    assert not ok and "ConnectError" in detail


async def test_timeout_is_named(transport) -> None:
    RELEASE["hang"] = asyncio.Event()
    hanging = WorkItem("p", "i", 0, 1, b"hang", 1, "key")
    async with serve_app(answer) as url:
        async with HttpProcessor(HttpProcessorConfig(handler_url=url, transport=transport,
                                                     request_timeout=0.3)) as http:
            try:
                with pytest.raises(RetryableError, match="request_timeout"):
                    await http.process(hanging)
            finally:
                RELEASE["hang"].set()


async def stalls_mid_body(scope, receive, send) -> None:
    """Sends the headers and half the body, then nothing until the test is done."""
    if scope["type"] != "http":
        return
    await read_body(receive)
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"14")]})
    await send({"type": "http.response.body", "body": b'{"done"', "more_body": True})
    await RELEASE["stall"].wait()
    await send({"type": "http.response.body", "body": b': true}'})


async def test_timeout_covers_reading_the_answer(transport) -> None:
    """request_timeout is end to end: an answer whose body stops arriving times out too."""
    RELEASE["stall"] = asyncio.Event()
    async with serve_app(stalls_mid_body) as url:
        async with HttpProcessor(HttpProcessorConfig(handler_url=url, transport=transport,
                                                     request_timeout=0.3)) as http:
            try:
                async with asyncio.timeout(10):
                    with pytest.raises(RetryableError, match="request_timeout"):
                        await http.process(ITEM)
            finally:
                RELEASE["stall"].set()


async def compressed(scope, receive, send) -> None:
    """A gzip body of about 1 KiB that inflates to 64 KiB of JSON, or a small plain one."""
    import gzip

    if scope["type"] != "http":
        return
    body = await read_body(receive)
    if body == b"small":
        answer_body, headers = b'{"done": true}', []
    else:
        document = b'{"done": true, "data": "' + b"x" * 65536 + b'"}'
        answer_body, headers = gzip.compress(document), [(b"content-encoding", b"gzip")]
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), *headers,
        (b"content-length", str(len(answer_body)).encode())]})
    await send({"type": "http.response.body", "body": answer_body})


async def test_a_compressed_answer_is_limited_by_its_inflated_size(transport) -> None:
    async with serve_app(compressed) as url:
        async with HttpProcessor(HttpProcessorConfig(
                handler_url=url, transport=transport, max_response_bytes=16384)) as http:
            small = await http.process(WorkItem("p", "i", 0, 1, b"small", 1, "key"))
            with pytest.raises(RetryableError, match="larger than max_response_bytes"):
                await http.process(ITEM)
    assert small == Result(done=True)


async def test_start_builds_the_client_once_and_never_after_close(transport) -> None:
    """``start()`` prepares the client before the first item (the service calls it at
    start-up; aiohttp's session is otherwise made at the first call); calls go through
    it, and a closed processor stays closed."""
    async with serve_app(answer) as url:
        http = HttpProcessor(HttpProcessorConfig(handler_url=url, transport=transport))
        sender = http.endpoint.sender
        attribute = "_session" if transport == "aiohttp" else "_client"
        if transport == "aiohttp":
            assert sender._session is None, "no session before start() or a first call"
        http.start()
        client = getattr(sender, attribute)
        assert client is not None
        http.start()
        assert getattr(sender, attribute) is client, "start() builds the client once"
        assert await http.process(ITEM) == Result(gate=2, data=b'"ok"')
        await http.aclose()
        http.start()
        with pytest.raises(RetryableError, match="closed"):
            await http.process(ITEM)


async def test_the_health_check_goes_through_the_item_calls_connections(transport) -> None:
    """No second client: the health GET reuses the pooled keep-alive connection of the
    item calls, with the same configured headers."""
    ports: list[tuple[str, str, int]] = []

    async def records(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        authorization = dict(scope["headers"]).get(b"authorization", b"").decode()
        ports.append((scope["method"], authorization, scope["client"][1]))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    async with serve_app(records) as url:
        config = HttpProcessorConfig(handler_url=url, transport=transport,
                                     health_url=f"{url}/healthz",
                                     headers={"Authorization": "Bearer t0ken-value"})
        async with HttpProcessor(config) as http:
            assert await http.process(ITEM) == Result()
            ok, detail = await http.check_health()
            assert await http.process(ITEM) == Result()
    assert ok and detail.endswith("/healthz answered HTTP 200")
    assert [(method, auth) for method, auth, _ in ports] == [
        ("POST", "Bearer t0ken-value"), ("GET", "Bearer t0ken-value"),
        ("POST", "Bearer t0ken-value")]
    assert len({port for _, _, port in ports}) == 1, ports


async def test_routes_to_one_server_share_its_keep_alive_connections() -> None:
    """A routing processor's services share one pool: ten routes to one server reuse
    the connections one route would (each call here follows the last, so one
    connection serves them all), and a retired service's close leaves the others'."""
    from processor.http.routed import RoutedHttpProcessor
    from processor.http.routes import parse_routes

    peers: list[tuple[str, int]] = []

    async def recorded(scope, receive, send) -> None:
        if scope["type"] == "http":
            peers.append(tuple(scope["client"]))
        await answer(scope, receive, send)

    async with serve_app(recorded) as url:
        def routes(count: int) -> str:
            return "".join(f'[[pipeline]]\nname = "p{n}"\n[[pipeline.route]]\ngate = "*"\n'
                           f'url = "{url}/?service={n}"\n' for n in range(count))

        def item(n: int) -> WorkItem:
            return WorkItem("p", "i", 0, 1, b"payload", 1, "", pipeline=f"p{n}")

        routed = RoutedHttpProcessor(parse_routes(routes(10)),
                                     HttpProcessorConfig(handler_url=url))
        try:
            for n in range(10):
                assert await routed.process(item(n)) == Result(gate=2, data=b'"ok"')
            assert len(peers) == 10 and len(set(peers)) == 1, peers
            # A reload retires nine services: their close leaves the pool to the last.
            for retired in routed.reload(parse_routes(routes(1))):
                await retired.aclose()
            assert await routed.process(item(0)) == Result(gate=2, data=b'"ok"')
            assert peers[-1] == peers[0]
        finally:
            await routed.aclose()
