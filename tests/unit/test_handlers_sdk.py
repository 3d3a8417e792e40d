"""The handlers SDK driven in-process through httpx's ASGI transport (no sockets)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import handlers
from handlers import Fail, Item, ItemDataError, Result, Retry
from handlers.examples import echo, resumes, samples
from handlers.wire.contract import coerce_result, encode_result

HEADERS = {
    "X-Partition-Id": "opening-42",
    "X-Item-Id": "resume-7",
    "X-Gate": "0",
    "X-Attempt": "1",
    "Idempotency-Key": "opening-42/resume-7/0/3",
}
WAIT = 5.0  # seconds; a deadline for events that arrive at once when the code is right


@contextlib.asynccontextmanager
async def client_for(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://handler") as client:
        yield client


async def post_item(app: Any, body: bytes = b"{}", **header_changes: str | bytes | None
                    ) -> httpx.Response:
    """POST one item; ``X_Gate="3"`` changes a header, ``X_Gate=None`` removes it."""
    headers: dict[str, str | bytes] = dict(HEADERS)
    for name, value in header_changes.items():
        name = name.replace("_", "-")
        if value is None:
            headers.pop(name)
        else:
            headers[name] = value
    async with client_for(app) as client:
        return await client.post("/", content=body, headers=headers)


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"] == "application/json"
    return response.json()["error"]


def assert_no_context(message: str) -> None:
    """The SDK's error message says none of what the processor puts before it."""
    for context in ("opening-42", "resume-7", "partition '", "(attempt"):
        assert context not in message, (context, message)


class Recorder:
    """A handler function that records the items it saw and answers ``result``."""

    def __init__(self, result: Any = None) -> None:
        self.items: list[Item] = []
        self.threads: list[int] = []
        self.result = Result(done=True) if result is None else result

    def __call__(self, item: Item) -> Any:
        self.items.append(item)
        self.threads.append(threading.get_ident())
        return self.result


# --------------------------------------------------------------------------- requests


async def test_the_item_carries_headers_and_body_unchanged_with_ids_percent_decoded() -> None:
    recorder = Recorder()
    body = b"\x00\xff binary \r\n"
    response = await post_item(handlers.app(recorder), body, X_Partition_Id="a%25b",
                               X_Item_Id="r%C3%A9sum%C3%A9%20%231", X_Gate="12",
                               X_Attempt="3", Idempotency_Key="k%2F1")
    assert response.status_code == 200
    assert recorder.items == [Item(id="résumé #1", partition_id="a%b", gate=12, attempt=3,
                                   idempotency_key="k/1", data=body)]


@pytest.mark.parametrize("header", list(HEADERS))
async def test_a_missing_contract_header_is_a_non_retryable_400_naming_it(header: str) -> None:
    recorder = Recorder()
    response = await post_item(handlers.app(recorder), **{header.replace("-", "_"): None})
    assert response.status_code == 400
    error = error_of(response)
    assert error["no_retry"] is True
    assert error["message"].startswith(f"missing header {header};")
    assert recorder.items == []


@pytest.mark.parametrize("header", ["X-Gate", "X-Attempt"])
@pytest.mark.parametrize("value", ["", "abc", "-1", "+1", "1.0", " 1", "1_0", "\u0661".encode(),
                                   "9223372036854775808", "99999999999999999999"])
async def test_a_gate_or_attempt_that_is_not_a_plain_integer_is_refused(
        header: str, value: str | bytes) -> None:
    recorder = Recorder()
    response = await post_item(handlers.app(recorder), **{header.replace("-", "_"): value})
    assert response.status_code == 400
    error = error_of(response)
    assert error["no_retry"] is True
    assert f"header {header} must be an integer" in error["message"]
    assert recorder.items == []


async def test_attempt_zero_is_refused_but_gate_zero_and_the_largest_gate_are_fine() -> None:
    recorder = Recorder()
    app = handlers.app(recorder)
    assert (await post_item(app, X_Attempt="0")).status_code == 400
    assert (await post_item(app, X_Gate="0")).status_code == 200
    assert (await post_item(app, X_Gate=str(2**31 - 1))).status_code == 200
    assert [item.gate for item in recorder.items] == [0, 2**31 - 1]


async def test_an_invalid_percent_encoding_in_an_id_is_refused() -> None:
    response = await post_item(handlers.app(Recorder()), X_Item_Id="bad%FF")
    assert response.status_code == 400
    assert "X-Item-Id is not valid percent-encoded UTF-8" in error_of(response)["message"]


# --------------------------------------------------------------------------- results


@pytest.mark.parametrize(("result", "body"), [
    (Result(), b"{}"),
    (Result(done=True), b'{"done":true}'),
    (Result(gate=3), b'{"gate":3}'),
    (Result(gate=0), b'{"gate":0}'),
    (Result(gate=3, done=True), b'{"gate":3,"done":true}'),
    (Result(gate=0, done=True, data=[]), b'{"gate":0,"done":true,"data":[]}'),
    (Result(gate=1, done=False, data={"a": [1, "é"], "b": None}),
     '{"gate":1,"data":{"a":[1,"é"],"b":null}}'.encode()),
    (Result(data=None), b'{"data":null}'),
    (Result(data=""), b'{"data":""}'),
    (Result(data=b"\x00\xff"), b'{"data_b64":"AP8="}'),
    (Result(data=bytearray(b"hi")), b'{"data_b64":"aGk="}'),
    (Result(data=b""), b'{"data_b64":""}'),
    ({"gate": 2, "done": True}, b'{"gate":2,"done":true}'),
    ({"data": [1, 2]}, b'{"data":[1,2]}'),
])
async def test_results_are_sent_compactly_with_only_the_fields_that_say_something(
        result: Any, body: bytes) -> None:
    response = await post_item(handlers.app(Recorder(result)))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-length"] == str(len(body))
    assert response.content == body


def test_unset_data_is_omitted_but_none_is_not() -> None:
    assert Result().data is handlers.UNSET
    assert json.loads(encode_result(Result(gate=1))) == {"gate": 1}
    assert json.loads(encode_result(Result(gate=1, data=None))) == {"gate": 1, "data": None}


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"gate": True}, TypeError), ({"gate": 1.0}, TypeError), ({"gate": "1"}, TypeError),
    ({"gate": -1}, ValueError), ({"gate": 2**31}, ValueError), ({"done": 1}, TypeError),
    ({"done": None}, TypeError),
])
def test_result_refuses_wrong_gates_and_done(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        Result(**kwargs)


async def test_returning_none_is_a_retryable_500_that_names_the_fix() -> None:
    response = await post_item(handlers.app(lambda item: None))
    assert response.status_code == 500
    error = error_of(response)
    assert error["no_retry"] is False
    assert "returned None" in error["message"]
    assert "Result(done=True)" in error["message"]
    assert_no_context(error["message"])


@pytest.mark.parametrize(("value", "fragment"), [
    ("done", "returned a str"),
    ({"gate": 1, "dta": 2}, "unknown keys ['dta']"),
    ({"gate": "1"}, "invalid result"),
    (Result(data={1, 2}), "cannot be encoded as JSON (TypeError"),
    (Result(data=float("nan")), "cannot be encoded as JSON (ValueError"),
    (Result(data="\ud800"), "cannot be encoded as JSON (UnicodeEncodeError"),
])
async def test_an_unusable_return_value_is_a_retryable_500_saying_why(value: Any,
                                                                      fragment: str) -> None:
    response = await post_item(handlers.app(lambda item: value))
    assert response.status_code == 500
    error = error_of(response)
    assert error["no_retry"] is False
    assert fragment in error["message"]


def test_coerce_result_passes_results_through_and_builds_them_from_dicts() -> None:
    result = Result(gate=4)
    assert coerce_result(result) is result
    assert coerce_result({"done": True, "data": b"x"}) == Result(done=True, data=b"x")
    with pytest.raises(TypeError, match="returned None"):
        coerce_result(None)


# --------------------------------------------------------------------------- errors


async def test_retry_is_a_503_with_retry_after_rounded_up_and_exact_in_the_body() -> None:
    def busy(item: Item) -> Result:
        raise Retry("rate limited upstream", retry_after=1.5)

    response = await post_item(handlers.app(busy))
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert error_of(response) == {"message": "rate limited upstream", "no_retry": False,
                                  "retry_after": 1.5}


async def test_retry_without_a_delay_sends_no_retry_after() -> None:
    async def busy(item: Item) -> Result:
        raise Retry()

    response = await post_item(handlers.app(busy))
    assert response.status_code == 503
    assert "retry-after" not in response.headers
    assert error_of(response) == {"message": Retry.default_message, "no_retry": False}


@pytest.mark.parametrize("delay", [-1, float("inf"), float("nan"), True, "5"])
def test_retry_refuses_a_delay_that_is_not_a_non_negative_number(delay: Any) -> None:
    with pytest.raises(ValueError, match="retry_after"):
        Retry("later", retry_after=delay)


async def test_fail_is_a_422_that_is_not_retried() -> None:
    def refuse(item: Item) -> Result:
        raise Fail("resume is in a language we do not read")

    response = await post_item(handlers.app(refuse))
    assert response.status_code == 422
    assert error_of(response) == {"message": "resume is in a language we do not read",
                                  "no_retry": True}


async def test_an_exception_is_a_retryable_500_logged_once_and_the_app_keeps_serving(
        caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def flaky(item: Item) -> Result:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("skills")
        return Result(done=True)

    app = handlers.app(flaky)
    with caplog.at_level(logging.DEBUG, logger="handlers"):
        first = await post_item(app)
        second = await post_item(app)
    assert first.status_code == 500
    assert error_of(first) == {"message": "KeyError: 'skills'", "no_retry": False}
    assert second.status_code == 200
    logged = [record for record in caplog.records if record.exc_info]
    assert len(logged) == 1
    assert logged[0].levelno == logging.ERROR
    assert logged[0].exc_info[0] is KeyError
    assert "item=resume-7" in logged[0].getMessage()


async def test_an_exception_without_a_message_is_named_by_its_type() -> None:
    async def broken(item: Item) -> Result:
        raise RuntimeError

    response = await post_item(handlers.app(broken))
    assert error_of(response)["message"] == "RuntimeError"


async def test_invalid_json_in_the_item_is_a_non_retryable_400_saying_why() -> None:
    """The processor puts the partition, item, gate and attempt before the error it
    stores: the SDK's message leaves them out, so each is said once."""
    response = await post_item(handlers.app(lambda item: Result(data=item.json())),
                               b"{not json")
    assert response.status_code == 400
    error = error_of(response)
    assert error["no_retry"] is True
    assert error["message"].startswith("data is not valid JSON")
    assert_no_context(error["message"])


def test_item_json_and_text_decode_or_raise_a_value_error_that_fails_the_item() -> None:
    item = Item(id="i", partition_id="p", data='{"name": "Zoë"}'.encode())
    assert item.json() == {"name": "Zoë"}
    assert item.text() == '{"name": "Zoë"}'
    for data in (b"\xff\xfe\xfa", b"NaN", b""):
        with pytest.raises(ItemDataError, match=r"^data is not valid JSON") as raised:
            Item(id="i", partition_id="p", data=data).json()
        assert isinstance(raised.value, ValueError)
        assert isinstance(raised.value, Fail)
        # In a reduce page the processor names the page, not the item: the SDK names it.
        with pytest.raises(ItemDataError, match=r"^item 'i': data is not valid JSON"):
            Item(id="i", partition_id="p", data=data, in_reduce=True).json()
    with pytest.raises(ItemDataError, match=r"^data is not valid UTF-8"):
        Item(id="i", partition_id="p", data=b"\xff").text()


# --------------------------------------------------------------------------- routes


async def test_health_unknown_paths_and_wrong_methods() -> None:
    app = handlers.app(Recorder())
    async with client_for(app) as client:
        health = await client.get("/healthz")
        head = await client.head("/healthz")
        unknown = await client.post("/process", content=b"{}", headers=HEADERS)
        get_item = await client.get("/")
        post_health = await client.post("/healthz")
        get_batch = await client.get("/batch")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert head.status_code == 200
    assert unknown.status_code == 404
    assert "no route for POST /process" in error_of(unknown)["message"]
    assert error_of(unknown)["no_retry"] is True
    assert (get_item.status_code, get_item.headers["allow"]) == (405, "POST")
    assert (post_health.status_code, post_health.headers["allow"]) == (405, "GET, HEAD")
    assert (get_batch.status_code, get_batch.headers["allow"]) == (405, "POST")


async def test_custom_paths_and_disabled_routes() -> None:
    recorder = Recorder()
    app = handlers.app(recorder, path="/process", health_path="/ready", batch_path=None)
    async with client_for(app) as client:
        item = await client.post("/process", content=b"{}", headers=HEADERS)
        root = await client.post("/", content=b"{}", headers=HEADERS)
        ready = await client.get("/ready")
        batch = await client.post("/batch", json=[])
    assert item.status_code == 200
    assert len(recorder.items) == 1
    assert (root.status_code, ready.status_code, batch.status_code) == (404, 200, 404)


async def test_a_body_over_the_limit_is_a_non_retryable_413_and_never_reaches_the_function(
        ) -> None:
    recorder = Recorder()
    app = handlers.app(recorder, max_body_bytes=10)
    at_limit = await post_item(app, b"x" * 10)
    over = await post_item(app, b"x" * 11)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"xxxx"

    async with client_for(app) as client:  # streamed: no Content-Length, several chunks
        streamed = await client.post("/", content=chunks(), headers=HEADERS)
    assert at_limit.status_code == 200
    assert [item.data for item in recorder.items] == [b"x" * 10]
    for response in (over, streamed):
        assert response.status_code == 413
        assert error_of(response)["no_retry"] is True
        assert "max_body_bytes (10 bytes)" in error_of(response)["message"]


@pytest.mark.parametrize(("chunks", "unread"), [
    ([b"x" * 11], 0),
    ([b"x" * 6, b"x" * 5], 0),
    ([b"x" * 11, b"x", b"x"], 2),  # reading stops once the limit is passed
])
async def test_the_body_limit_holds_without_a_content_length(chunks: list[bytes],
                                                             unread: int) -> None:
    recorder = Recorder()
    app = handlers.app(recorder, max_body_bytes=10)
    headers = [(name.lower().encode(), value.encode()) for name, value in HEADERS.items()]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    messages = [{"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1}
                for n, chunk in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 413
    assert b"max_body_bytes (10 bytes)" in sent[1]["body"]
    assert recorder.items == []
    assert len(messages) == unread


async def test_a_client_that_disconnects_mid_body_gets_no_answer_and_no_call() -> None:
    recorder = Recorder()
    app = handlers.app(recorder)
    headers = [(name.lower().encode(), value.encode()) for name, value in HEADERS.items()]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    messages = [{"type": "http.request", "body": b"{", "more_body": True},
                {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    assert (sent, recorder.items) == ([], [])


async def test_a_streamed_body_is_joined_in_order() -> None:
    recorder = Recorder()

    async def chunks() -> AsyncIterator[bytes]:
        for part in (b"ab", b"", b"cd", b"e"):
            yield part

    async with client_for(handlers.app(recorder)) as client:
        response = await client.post("/", content=chunks(), headers=HEADERS)
    assert response.status_code == 200
    assert recorder.items[0].data == b"abcde"


# --------------------------------------------------------------------------- sync and async


async def test_a_sync_function_runs_in_a_thread_and_does_not_block_the_loop() -> None:
    entered, release = threading.Event(), threading.Event()

    def blocking(item: Item) -> Result:
        entered.set()
        # If this ran on the event loop, the health request below could not be
        # answered, release would never be set and this would return False.
        return Result(done=True, data={"released": release.wait(WAIT),
                                       "thread": threading.get_ident()})

    app = handlers.app(blocking)
    async with client_for(app) as client:
        call = asyncio.create_task(client.post("/", content=b"{}", headers=HEADERS))
        assert await asyncio.to_thread(entered.wait, WAIT)
        health = await client.get("/healthz")
        release.set()
        response = await call
    assert health.status_code == 200
    data = response.json()["data"]
    assert data["released"] is True
    assert data["thread"] != threading.get_ident()


async def test_async_functions_and_async_callables_run_on_the_event_loop() -> None:
    threads: list[int] = []

    async def function(item: Item) -> Result:
        threads.append(threading.get_ident())
        return Result(gate=1)

    class Callable:
        async def __call__(self, item: Item) -> Result:
            threads.append(threading.get_ident())
            return Result(gate=2)

    first = await post_item(handlers.app(function))
    second = await post_item(handlers.app(Callable()))
    assert (first.json(), second.json()) == ({"gate": 1}, {"gate": 2})
    assert threads == [threading.get_ident()] * 2


async def test_a_sync_function_returning_a_coroutine_is_awaited() -> None:
    async def inner(item: Item) -> Result:
        return Result(gate=9)

    response = await post_item(handlers.app(lambda item: inner(item)))
    assert response.json() == {"gate": 9}


async def test_sync_functions_see_the_callers_context_variables() -> None:
    import contextvars

    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    request_id.set("outer")
    response = await post_item(handlers.app(lambda item: Result(data=request_id.get("none"))))
    assert response.json() == {"data": "outer"}


# --------------------------------------------------------------------------- gates


async def test_a_gate_mapping_routes_each_item_by_its_gate() -> None:
    first, second = Recorder(Result(gate=1)), Recorder(Result(done=True))
    app = handlers.app({0: first, 1: second})
    assert (await post_item(app, X_Gate="0")).json() == {"gate": 1}
    assert (await post_item(app, X_Gate="1")).json() == {"done": True}
    assert ([item.gate for item in first.items], [item.gate for item in second.items]) == (
        [0], [1])


async def test_an_item_at_a_gate_without_a_handler_fails_naming_the_gates_handled() -> None:
    response = await post_item(handlers.app({0: Recorder(), 2: Recorder()}), X_Gate="1")
    assert response.status_code == 422
    error = error_of(response)
    assert error["no_retry"] is True
    assert error["message"] == "no handler for this gate; this app handles gates 0, 2"


@pytest.mark.parametrize(("args", "kwargs", "error"), [
    ((42,), {}, TypeError),
    (({},), {}, ValueError),
    (({True: print},), {}, TypeError),
    (({-1: print},), {}, TypeError),
    (({0: "not callable"},), {}, TypeError),
    ((print,), {"path": "process"}, ValueError),
    ((print,), {"batch_path": "/"}, ValueError),
    ((print,), {"max_body_bytes": 0}, ValueError),
    ((print,), {"threads": 0}, ValueError),
])
def test_app_refuses_bad_arguments(args: tuple[Any, ...], kwargs: dict[str, Any],
                                   error: type) -> None:
    with pytest.raises(error):
        handlers.app(*args, **kwargs)


# --------------------------------------------------------------------------- batch


def batch_entry(item_id: str, data: bytes = b"{}", gate: int = 0, **changes: Any
                ) -> dict[str, Any]:
    entry = {"partition_id": "opening-42", "item_id": item_id, "gate": gate, "attempt": 1,
             "idempotency_key": f"key-{item_id}",
             "data_b64": base64.b64encode(data).decode()}
    entry.update(changes)
    return entry


async def test_a_batch_answers_every_entry_in_order_with_results_or_errors() -> None:
    def process(item: Item) -> Result:
        if item.id == "busy":
            raise Retry("later", retry_after=3)
        if item.id == "bad":
            raise Fail("unreadable")
        return Result(gate=item.gate + 1, data=item.data + b"!")

    entries = [batch_entry("a", b"one"), batch_entry("busy"), {"item_id": "x"},
               batch_entry("bad"), batch_entry("b", b"two", gate=4),
               batch_entry("c", gate="1"), "not an object"]
    async with client_for(handlers.app(process)) as client:
        response = await client.post("/batch", json=entries)
    assert response.status_code == 200
    results = response.json()
    assert len(results) == len(entries)
    assert results[0] == {"gate": 1, "data_b64": base64.b64encode(b"one!").decode()}
    assert results[1] == {"error": {"message": "later", "no_retry": False, "retry_after": 3.0}}
    assert results[2]["error"]["no_retry"] is True
    assert results[2]["error"]["message"].startswith("batch entry 2 has no 'partition_id'")
    assert results[3] == {"error": {"message": "unreadable", "no_retry": True}}
    assert results[4] == {"gate": 5, "data_b64": base64.b64encode(b"two!").decode()}
    assert "batch entry 5: 'gate' must be an integer" in results[5]["error"]["message"]
    assert results[6]["error"]["message"] == "batch entry 6 is a JSON string, not an object"


async def test_batch_entries_run_concurrently() -> None:
    arrived = 0
    everyone_here = asyncio.Event()

    async def meet(item: Item) -> Result:
        # Completes only if all three entries are in flight at once.
        nonlocal arrived
        arrived += 1
        if arrived == 3:
            everyone_here.set()
        async with asyncio.timeout(WAIT):
            await everyone_here.wait()
        return Result(done=True)

    async with client_for(handlers.app(meet)) as client:
        response = await client.post("/batch", json=[batch_entry(str(n)) for n in range(3)])
    assert response.json() == [{"done": True}] * 3


@pytest.mark.parametrize(("body", "fragment"), [
    (b'{"items": []}', "the batch body is a JSON object"),
    (b"[1,", "the batch body is not valid JSON"),
    (b"\xff", "the batch body is not valid JSON"),
])
async def test_a_batch_body_that_is_not_an_array_is_a_non_retryable_400(body: bytes,
                                                                        fragment: str) -> None:
    async with client_for(handlers.app(Recorder())) as client:
        response = await client.post("/batch", content=body)
    assert response.status_code == 400
    assert error_of(response)["no_retry"] is True
    assert fragment in error_of(response)["message"]


async def test_an_empty_batch_is_an_empty_array() -> None:
    async with client_for(handlers.app(Recorder())) as client:
        response = await client.post("/batch", json=[])
    assert (response.status_code, response.content) == (200, b"[]")


async def test_a_batch_entry_with_bad_base64_is_refused_alone() -> None:
    async with client_for(handlers.app(Recorder())) as client:
        response = await client.post("/batch", json=[batch_entry("a", data_b64="AP8"),
                                                     batch_entry("b")])
    results = response.json()
    assert "'data_b64' is not valid base64" in results[0]["error"]["message"]
    assert results[1] == {"done": True}


# --------------------------------------------------------------------------- lifespan


async def test_lifespan_completes_and_shutdown_stops_the_thread_pool() -> None:
    app = handlers.app(Recorder())
    assert (await post_item(app)).status_code == 200  # starts the pool
    pool = app._pool
    assert pool is not None
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: list[dict[str, Any]] = []
    for message in ("lifespan.startup", "lifespan.shutdown"):
        inbox.put_nowait({"type": message})

    async def send(message: dict[str, Any]) -> None:
        outbox.append(message)

    async with asyncio.timeout(WAIT):
        await app({"type": "lifespan"}, inbox.get, send)
    assert [message["type"] for message in outbox] == [
        "lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert app._pool is None
    with pytest.raises(RuntimeError):
        pool.submit(print)  # shut down
    assert (await post_item(app)).status_code == 200  # a new pool starts on demand


# --------------------------------------------------------------------------- examples


async def test_echo_completes_and_keeps_the_bytes() -> None:
    response = await post_item(echo.app, b"\x00anything")
    assert (response.status_code, response.content) == (200, b'{"done":true}')


@pytest.mark.parametrize(("text", "skills"), [
    ("Python, Postgres and K8s", ["kubernetes", "postgresql", "python"]),
    ("PostgreSQL only", ["postgresql"]),  # no "sql" inside it
    ("JavaScript, not Java", ["java", "javascript"]),
    ("React.js, Vue.js and TS.", ["react", "typescript", "vue"]),
    ("reactive programming; rusty trust", []),
    ("CI/CD with Bash; sklearn", ["bash", "ci/cd", "scikit-learn"]),
])
def test_extract_skills_knows_aliases_and_word_boundaries(text: str, skills: list[str]) -> None:
    assert resumes.extract_skills(text) == skills


@pytest.mark.parametrize(("text", "years"), [
    ("5 years of experience", 5), ("12+ years, 3 yrs at Acme", 12), ("(8 yrs)", 8),
    ("Recent graduate", 0), ("1 year", 1), ("99 years", 50),
])
def test_extract_years_takes_the_largest_stated_number(text: str, years: int) -> None:
    assert resumes.extract_years(text) == years


def test_classify_picks_the_role_with_the_most_skills_and_the_title_breaks_ties() -> None:
    data = resumes.classify({"name": "Ada", "text": "Engineer\n7 years: Spark, SQL, Pandas, "
                                                     "React"})
    assert data == {"name": "Ada", "role": "data", "years": 7,
                    "skills": ["pandas", "react", "spark", "sql"],
                    "role_skills": ["pandas", "spark", "sql"], "fit": 0.6}
    # python is a backend and a data skill: tied, the first role wins ...
    assert resumes.classify({"text": "Engineer\nPython"})["role"] == "backend"
    # ... unless the first line names the role.
    assert resumes.classify({"text": "Data Engineer\nPython"})["role"] == "data"
    # a hint alone is no classification
    assert resumes.classify({"text": "Data Engineer\nCOBOL"})["role"] == "general"


@pytest.mark.parametrize("resume", [[], {"name": "x"}, {"text": 3}, {"text": "", "name": 5}])
def test_classify_refuses_what_is_not_a_resume(resume: Any) -> None:
    with pytest.raises(ValueError):
        resumes.classify(resume)


@pytest.mark.parametrize(("enriched", "score"), [
    ({"fit": 1.0, "years": 12, "skills": list("abcdefgh")}, 100.0),
    ({"fit": 1, "years": 30, "skills": list("abcdefghij")}, 100.0),
    ({"fit": 0.0, "years": 0, "skills": []}, 0.0),
    ({"fit": 0.6, "years": 6, "skills": list("abcd")}, 55.0),  # 30 + 17.5 + 7.5
])
def test_final_score_follows_the_rubric(enriched: dict[str, Any], score: float) -> None:
    assert resumes.final_score(enriched) == score


@pytest.mark.parametrize("enriched", [{}, {"fit": 2, "years": 1, "skills": []},
                                      {"fit": 0.5, "years": "3", "skills": []}, []])
def test_final_score_refuses_items_that_skipped_gate_0(enriched: Any) -> None:
    with pytest.raises(ValueError):
        resumes.final_score(enriched)


def test_top_candidates_orders_by_score_then_name_and_skips_unranked_items() -> None:
    def ranked(name: str, score: float) -> bytes:
        return json.dumps({"name": name, "role": "data", "years": 3, "score": score,
                           "tier": resumes.tier(score), "role_skills": ["sql"]}).encode()

    items = [ranked("Bo", 60.0), b"not json", ranked("Al", 80.5), b'{"name": "raw"}',
             ranked("Cy", 80.5), b'{"score": true}']
    best = resumes.top_candidates(items, 2)
    assert best == [
        {"rank": 1, "name": "Al", "role": "data", "years": 3, "score": 80.5, "tier": "A",
         "skills": ["sql"]},
        {"rank": 2, "name": "Cy", "role": "data", "years": 3, "score": 80.5, "tier": "A",
         "skills": ["sql"]},
    ]
    assert [row["name"] for row in resumes.top_candidates(items, 10)] == ["Al", "Cy", "Bo"]
    assert resumes.top_candidates(items, 0) == []
    with pytest.raises(ValueError):
        resumes.top_candidates(items, -1)


def test_sample_resumes_are_deterministic_varied_and_classifiable() -> None:
    documents = samples.sample_resumes(40, seed=7)
    assert documents == samples.sample_resumes(40, seed=7)
    assert documents != samples.sample_resumes(40, seed=8)
    parsed = [json.loads(document) for document in documents]
    assert all(set(resume) == {"name", "text"} for resume in parsed)
    classified = [resumes.classify(resume) for resume in parsed]
    assert {data["role"] for data in classified} == set(resumes.ROLE_SKILLS)
    assert len({data["years"] for data in classified}) >= 6
    assert any(data["years"] == 0 for data in classified)  # graduates state no years
    assert len({resume["text"] for resume in parsed}) == 40
    with pytest.raises(ValueError):
        samples.sample_resumes(-1)


async def test_the_resume_handler_classifies_at_gate_0_and_ranks_at_gate_1() -> None:
    resume = {"name": "Hana Novak", "text": "Senior Backend Engineer\n9 years with Golang, "
                                            "Kafka, Postgres, gRPC and K8s."}
    classified = await post_item(resumes.app, json.dumps(resume).encode(), X_Gate="0")
    assert classified.status_code == 200
    moved = classified.json()
    assert moved["gate"] == 1
    assert "done" not in moved
    assert moved["data"]["role"] == "backend"
    assert moved["data"]["fit"] == 1.0
    stored = json.dumps(moved["data"], separators=(",", ":")).encode()  # what the processor keeps
    ranked = await post_item(resumes.app, stored, X_Gate="1")
    assert ranked.status_code == 200
    final = ranked.json()
    assert final["done"] is True
    assert final["data"]["score"] == resumes.final_score(moved["data"])
    assert final["data"]["tier"] == "A"
    assert final["data"]["name"] == "Hana Novak"


@pytest.mark.parametrize(("gate", "body", "status", "fragment"), [
    ("0", b"not json", 400, "not valid JSON"),
    ("0", b'{"name": "x"}', 422, "needs a 'text' string"),
    ("1", b'{"name": "x", "text": "raw"}', 422, "the fields gate 0 adds"),
    ("1", b"[1, 2]", 422, "expected the JSON object gate 0 produces"),
    ("2", b"{}", 422, "no handler for this gate"),
])
async def test_the_resume_handler_fails_items_it_cannot_read(gate: str, body: bytes,
                                                             status: int, fragment: str) -> None:
    response = await post_item(resumes.app, body, X_Gate=gate)
    assert response.status_code == status
    error = error_of(response)
    assert error["no_retry"] is True
    assert fragment in error["message"]
    assert_no_context(error["message"])


def test_serve_wraps_functions_and_runs_uvicorn_without_an_access_log(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    runs: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: runs.append((app, options)))
    handlers.serve(echo.echo, port=9000)
    handlers.serve(echo.app, host="0.0.0.0", port=9001, access_log=True, log_level="info")
    assert isinstance(runs[0][0], handlers.HandlerApp)
    assert runs[0][1] == {"host": "127.0.0.1", "port": 9000, "access_log": False}
    assert runs[1] == (echo.app, {"host": "0.0.0.0", "port": 9001, "access_log": True,
                                  "log_level": "info"})
