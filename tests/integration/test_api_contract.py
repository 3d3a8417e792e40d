"""The ingest API holds to its OpenAPI document, processor/api/openapi.json.

The document is served verbatim and is valid OpenAPI 3.1; its paths and methods are
the routes of the code, no more and no fewer; a walk through every route on a live
server answers as documented; and schemathesis fuzzes every operation (valid and
invalid requests) against a live server on a fresh SQLite database: no answer is a
5xx, and every answer has a documented status, content type, headers and body.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import jsonschema_rs
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from processor.api.completions import COMPLETION_ROUTES
from processor.api.routes import PARTITION, ROUTES, STATIC_METHODS, STATIC_ROUTES
from processor.api.schedule_routes import SCHEDULE_ROUTES
from processor.api.server import ApiOptions, api_running, create_app
from watcher.errors import ConfigError, ValueRefusedError
from watcher.store.db.migrate import upgrade
from watcher.store.db.urls import parse_database_url

DOCUMENT = Path(str(files("processor.api").joinpath("openapi.json")))
OPENAPI_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
NDJSON = "application/x-ndjson"
CONFORMANCE = [not_a_server_error, status_code_conformance, content_type_conformance,
               response_headers_conformance, response_schema_conformance]
# Invalid requests must also be refused (4xx): the schema says what is valid.
CHECKS = {GenerationMode.POSITIVE: CONFORMANCE,
          GenerationMode.NEGATIVE: [*CONFORMANCE, negative_data_rejection]}
EXAMPLES = 30
SERVER_DEADLINE = 30.0
REQUEST_TIMEOUT = 20.0
# No processor runs here, so a partition never finishes: a wait lasts its whole
# timeout (30 s when absent). Fuzzed waits wait at most this long.
FUZZ_WAIT_SECONDS = 0.2
# A well-formed completion token no wait has.
UNKNOWN_TOKEN = "A" * 43


def documented_routes() -> set[tuple[str, str]]:
    """(METHOD, path template) of every operation the checked-in document has."""
    document = json.loads(DOCUMENT.read_text())
    return {(method.upper(), path) for path, item in document["paths"].items()
            for method in item if method in OPENAPI_METHODS}


def code_routes() -> set[tuple[str, str]]:
    """(METHOD, path template) of every route the code answers."""
    routes = {(method, "/" + "/".join(template))
              for template, handlers in ROUTES.items() for method in handlers}
    routes |= SCHEDULE_ROUTES | COMPLETION_ROUTES
    return routes | {(method, "/" + "/".join(template))
                     for template in STATIC_ROUTES for method in STATIC_METHODS}


DOCUMENTED = sorted(documented_routes())


class ServedInThread:
    """The API served by :func:`api_running` on an event loop in a thread of its own, so
    that synchronous clients (schemathesis's) can call it from the test's thread."""

    def __init__(self, options: ApiOptions) -> None:
        self.options = options
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None

    def __enter__(self) -> str:
        started: Future[str] = Future()
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(started),),
                                       name="api-under-test", daemon=True)
        self.thread.start()
        return started.result(timeout=SERVER_DEADLINE)

    async def _serve(self, started: Future[str]) -> None:
        self.loop = asyncio.get_running_loop()
        self.stop = asyncio.Event()
        try:
            async with api_running(self.options) as url:
                started.set_result(url)
                await self.stop.wait()
        except BaseException as error:
            if not started.done():
                started.set_exception(error)
            raise

    def __exit__(self, *_: object) -> None:
        assert self.thread is not None and self.loop is not None and self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(SERVER_DEADLINE)
        assert not self.thread.is_alive(), "the API did not stop"


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:<port>/``) of the API on a fresh, migrated
    SQLite database, shared by the module's tests."""
    db_url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'statefeed.db'}"
    upgrade(db_url, "")
    with ServedInThread(ApiOptions(parse_database_url(db_url), port=0)) as url:
        yield url


@st.composite
def ndjson_bodies(draw: st.DrawFn) -> bytes:
    """NDJSON bodies: mostly valid new items, with now and then a blank line, a line
    that is JSON but not a new item, or one that is not JSON."""
    item = st.fixed_dictionaries(
        {"id": st.text(min_size=1, max_size=8)},
        optional={"gate": st.integers(0, 3) | st.none()},
    ).flatmap(lambda base: st.one_of(
        st.builds(lambda data: {**base, "data": data},
                  st.none() | st.integers() | st.text(max_size=8)
                  | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)),
        st.builds(lambda raw: {**base, "data_b64": base64.b64encode(raw).decode()},
                  st.binary(max_size=8))))
    line = st.one_of(
        item.map(json.dumps), item.map(json.dumps), item.map(json.dumps),
        st.just(""), st.just('{"id": "x", "dta": 1}'), st.just("{not json"),
        st.just('{"id": "", "data": 1}'))
    lines = draw(st.lists(line, max_size=6))
    return ("\n".join(lines) + draw(st.sampled_from(["", "\n"]))).encode()


# The document types an NDJSON body as a string; schemathesis sends these bodies instead
# (registered for the process: nothing else here uses schemathesis).
schemathesis.openapi.media_type(NDJSON, ndjson_bodies())


@pytest.fixture(scope="module")
def api_schema(api_url: str) -> Any:
    """The document as the live server serves it, loaded by schemathesis."""
    return schemathesis.openapi.from_url(api_url + "v1/openapi.json")


# --------------------------------------------------------------------------- the document


def test_served_document_is_the_checked_in_file_and_valid_openapi_3_1(
        api_url: str, api_schema: Any) -> None:
    response = httpx.get(api_url + "v1/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.content == DOCUMENT.read_bytes()
    document = response.json()
    assert document["openapi"].startswith("3.1.")
    api_schema.validate()  # the OpenAPI 3.1 meta-schema, as schemathesis ships it
    for name, schema in document["components"]["schemas"].items():
        assert jsonschema_rs.meta.is_valid(
            {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}), name


def test_the_validator_refuses_a_broken_document() -> None:
    document = json.loads(DOCUMENT.read_text())
    del document["paths"]["/healthz"]["get"]["responses"]["200"]["description"]
    with pytest.raises(jsonschema_rs.ValidationError):
        schemathesis.openapi.from_dict(document).validate()


def test_documented_routes_are_the_routes_of_the_code() -> None:
    assert PARTITION == "{id}"  # the code's templates name the id as the document does
    assert documented_routes() == code_routes()


def test_every_documented_route_is_answered_and_no_other_method(api_url: str) -> None:
    document = json.loads(DOCUMENT.read_text())
    with httpx.Client(base_url=api_url, timeout=REQUEST_TIMEOUT) as client:
        for method, template in DOCUMENTED:
            path = template.replace("{id}", "routes%2Fprobe").replace(
                "{key}", "routes%2Fprobe").replace("{token}", UNKNOWN_TOKEN).lstrip("/")
            query = {"timeout": "0"} if template.endswith(("/wait", "/events")) else {}
            response = client.request(method, path, params=query, json={})
            assert response.status_code not in (404, 405) or (
                response.json()["error"]["code"] in ("partition_not_found", "key_not_found")
            ) or (template.startswith("/v1/completions/")
                  and response.json()["error"]["code"] == "not_found"), (method, path)
            documented = document["paths"][template][method.lower()]["responses"]
            assert str(response.status_code) in documented, (method, path, response.text)
        for path, item in document["paths"].items():
            for method in set(OPENAPI_METHODS) - set(item) - {"options", "trace"}:
                response = client.request(method.upper(), path.replace(
                    "{id}", "routes%2Fprobe").replace("{key}", "routes%2Fprobe").replace(
                    "{token}", UNKNOWN_TOKEN).lstrip("/"))
                assert response.status_code == 405, (method, path, response.text)
                allowed = {name.upper() for name in item if name in OPENAPI_METHODS}
                assert set(response.headers["allow"].split(", ")) == allowed


# --------------------------------------------------------------------------- a walk


def test_a_walk_through_every_route_answers_as_documented(
        api_url: str, api_schema: Any) -> None:
    base_url = api_url.rstrip("/")

    def call(method: str, path: str, status: int, **case: Any) -> Any:
        operation = api_schema[path][method]
        # Ids are given percent-encoded, as they go in the path.
        made = operation.Case(**{"path_parameters": {"id": "walk%2F1"}, **case})
        response = made.call_and_validate(base_url=base_url, checks=CONFORMANCE,
                                          timeout=REQUEST_TIMEOUT)
        assert response.status_code == status, response.text
        return response

    items = [{"id": "a", "data": {"x": [1, 2]}}, {"id": "b", "data_b64": "AAE="},
             {"id": "c", "gate": 2, "data": None}]
    create = {"items": items, "reduce_gates": [2], "on_item_failure": "continue"}
    first = call("PUT", "/v1/partitions/{id}", 201, body=create,
                 media_type="application/json", headers={"Idempotency-Key": "walk-1"})
    assert first.headers["idempotent-replayed"] == ["false"]
    assert first.json() == {"id": "walk/1", "items": 3, "first_gate": 0,
                            "reduce_gates": [2], "on_item_failure": "continue",
                            "key": None, "priority": 0, "quorum": None, "notify": None,
                            "start_at": None, "pipeline": "default", "pipeline_version": None}
    again = call("PUT", "/v1/partitions/{id}", 201, body=create,
                 media_type="application/json", headers={"Idempotency-Key": "walk-1"})
    assert again.headers["idempotent-replayed"] == ["true"]
    call("PUT", "/v1/partitions/{id}", 409, body={"items": items[:1]},
         media_type="application/json")
    call("PUT", "/v1/partitions/{id}", 400, body=b'{"id": "x", "data": 1}\n{"id": 2}\n',
         media_type=NDJSON)

    partition = call("GET", "/v1/partitions/{id}", 200).json()
    assert partition["counts"] == {"available": 3} and partition["result"] is None
    assert (partition["key"], partition["priority"], partition["paused"]) == (None, 0, False)
    paused = call("POST", "/v1/partitions/{id}/pause", 200).json()
    assert paused["paused"] is True and paused["paused_at"] is not None
    assert call("POST", "/v1/partitions/{id}/pause", 200).json()["paused"] is False
    assert call("GET", "/v1/partitions/{id}", 200).json()["paused_at"] == paused["paused_at"]
    resumed = call("POST", "/v1/partitions/{id}/resume", 200).json()
    assert (resumed["resumed"], resumed["paused_at"]) == (True, None)
    assert call("POST", "/v1/partitions/{id}/resume", 200).json()["resumed"] is False
    page = call("GET", "/v1/partitions/{id}/items", 200, query={"limit": 2}).json()
    assert [item["id"] for item in page["items"]] == ["a", "b"]
    assert page["items"][0]["data"] == {"x": [1, 2]}
    assert page["items"][1]["data_b64"] == "AAE="
    rest = call("GET", "/v1/partitions/{id}/items", 200,
                query={"after": page["next_cursor"], "data": "false"}).json()
    assert [item["id"] for item in rest["items"]] == ["c"] and rest["next_cursor"] is None
    assert "data" not in rest["items"][0] and "data_b64" not in rest["items"][0]
    call("GET", "/v1/partitions/{id}/items", 422, query={"status": "lost"})
    call("GET", "/v1/partitions/{id}/wait", 202, query={"timeout": 0})
    feed = call("GET", "/v1/partitions/{id}/events", 200, query={"timeout": 0})
    assert feed.text.startswith("retry: ") and "event: state\n" in feed.text

    added = call("POST", "/v1/partitions/{id}/items", 200, media_type=NDJSON,
                 body=b'{"id": "d", "gate": 1, "data_b64": "TmFO"}\n').json()
    assert added == {"id": "walk/1", "added": 1, "reopened": False}
    call("POST", "/v1/partitions/{id}/items", 409, media_type="application/json",
         body={"items": [{"id": "a", "data": 1}]})
    call("POST", "/v1/partitions/{id}/items", 415, media_type="text/plain", body="a")
    nan = call("GET", "/v1/partitions/{id}/items", 200, query={"gate": 1}).json()
    assert nan["items"][0]["data_b64"] == "TmFO"  # "NaN": bytes, not JSON

    cancelled = call("POST", "/v1/partitions/{id}/cancel", 200).json()
    assert cancelled == {"id": "walk/1", "cancelled": True, "status": "cancelled"}
    finished = call("GET", "/v1/partitions/{id}/wait", 200, query={"timeout": 1}).json()
    assert finished["finished"] is True
    retried = call("POST", "/v1/partitions/{id}/retry", 200).json()
    assert retried["status_before"] == "cancelled" and retried["reopened"] is True
    deleted = call("DELETE", "/v1/partitions/{id}", 200, query={"force": True}).json()
    assert deleted == {"id": "walk/1", "deleted": True, "items_deleted": 4}
    call("GET", "/v1/partitions/{id}", 404)
    for bad_id, status in (("x" * 256, 422), ("a%00b", 422), ("%FF", 400)):
        call("GET", "/v1/partitions/{id}", status, path_parameters={"id": bad_id})

    # The flow settings: a key, a priority and a start time (in the JSON body, or the
    # query of an NDJSON create).
    flow = {"path_parameters": {"id": "walk%2Fflow"}}
    made = call("PUT", "/v1/partitions/{id}", 201, media_type="application/json",
                body={"key": "acme", "priority": -3, "start_at": "2000-01-02T03:04:05+01:00"},
                **flow).json()
    assert (made["key"], made["priority"], made["start_at"]) == (
        "acme", -3, "2000-01-02T02:04:05+00:00")
    shown = call("GET", "/v1/partitions/{id}", 200, **flow).json()
    assert (shown["key"], shown["priority"]) == ("acme", -3)
    call("PUT", "/v1/partitions/{id}", 422, media_type="application/json",
         body={"priority": 11}, path_parameters={"id": "walk%2Fhigh"})
    call("PUT", "/v1/partitions/{id}", 422, media_type="application/json",
         body={"start_at": "2026-11-26T10:00:00"}, path_parameters={"id": "walk%2Fnaive"})
    lines = call("PUT", "/v1/partitions/{id}", 201, media_type=NDJSON,
                 body=b'{"id": "x", "data": 1}\n', query={"key": "globex", "priority": 2},
                 path_parameters={"id": "walk%2Flines"}).json()
    assert (lines["key"], lines["priority"], lines["start_at"]) == ("globex", 2, None)
    call("POST", "/v1/partitions/{id}/pause", 404, path_parameters={"id": "walk%2Fnone"})

    # A stopped partition with no failed or available item re-opens (it was a 500).
    empty = {"path_parameters": {"id": "walk%2Fempty"}}
    call("PUT", "/v1/partitions/{id}", 201, body={}, media_type="application/json", **empty)
    call("POST", "/v1/partitions/{id}/cancel", 200, **empty)
    reopened = call("POST", "/v1/partitions/{id}/retry", 200, **empty).json()
    assert (reopened["status_before"], reopened["status"]) == ("cancelled", "available")


# Query values that int() or float() take but the API does not, and so refuses (400);
# those that raised (isdigit() but not int(), over int()'s digit limit) were 500s.
ODD_QUERIES = [
    ("GET", "/v1/partitions/{id}/items", {"gate": "\u00b2"}),
    ("GET", "/v1/partitions/{id}/items", {"limit": "9" * 5000}),
    ("GET", "/v1/partitions/{id}/items", {"limit": "\u0661"}),
    ("GET", "/v1/partitions/{id}/items", {"limit": " 5"}),
    ("GET", "/v1/partitions/{id}/wait", {"timeout": "1_0"}),
    ("GET", "/v1/partitions/{id}/wait", {"timeout": "1e999"}),
    ("PUT", "/v1/partitions/{id}", {"reduce_gates": "1_0"}),
    ("PUT", "/v1/partitions/{id}", {"reduce_gates": "9" * 5000}),
]


def test_odd_inputs_are_refused_or_shown_as_documented(
        api_url: str, api_schema: Any) -> None:
    with httpx.Client(base_url=api_url, timeout=REQUEST_TIMEOUT) as client:
        # Stored bytes that JSON decodes but no answer can carry were 500s on reading.
        odd_bytes = [b"NaN", b"1e999", b'"\\ud800"', '"\u00e9"'.encode("utf-16")]
        items = [{"id": f"b{n}", "data_b64": base64.b64encode(raw).decode()}
                 for n, raw in enumerate(odd_bytes)]
        created = client.put("v1/partitions/odd", json={"items": items})
        assert created.status_code == 201, created.text
        listed = client.get("v1/partitions/odd/items")
        api_schema["/v1/partitions/{id}/items"]["GET"].validate_response(listed)
        assert [item["data_b64"] for item in listed.json()["items"]] == [
            item["data_b64"] for item in items]
        for method, template, query in ODD_QUERIES:
            response = client.request(
                method, template.replace("{id}", "odd").lstrip("/"), params=query,
                headers={"content-type": NDJSON}, content=b"")
            assert response.status_code == 400, (query, response.text)
            assert response.json()["error"]["field"] == next(iter(query))
            api_schema[template][method].validate_response(response)
        # A key with an unpaired surrogate, named in the answer: it was a bare 500.
        unknown = client.put("v1/partitions/odd2", content=b'{"\\udc00": 1}',
                             headers={"content-type": "application/json"})
        assert unknown.status_code == 400
        assert unknown.json()["error"]["field"] == "\udc00"


class RefusingClient:
    """A client whose writes fail as no SQLite database makes them fail."""

    async def add_items(self, partition_id: str, items: object) -> bool:
        raise ValueRefusedError("the statement is 70 MiB; the server takes 64 MiB")

    async def retry_failed(self, partition_id: str) -> object:
        raise ConfigError("a statefeed error with no answer of its own")


async def test_errors_the_database_raises_keep_the_documented_shape(api_schema: Any) -> None:
    app = create_app(ApiOptions(parse_database_url("sqlite:///unused.db"), port=0),
                     client=RefusingClient())  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        refused = await client.post("/v1/partitions/p/items",
                                    json={"items": [{"id": "a", "data": 1}]})
        assert refused.status_code == 413 and refused.json()["error"]["code"] == "too_large"
        api_schema["/v1/partitions/{id}/items"]["POST"].validate_response(refused)
        failed = await client.post("/v1/partitions/p/retry")
        assert failed.status_code == 500  # a bug to fix, but in the one error shape
        assert failed.json()["error"]["code"] == "internal_error"


# --------------------------------------------------------------------------- fuzzing


def fuzzed(method: str, path: str) -> list[Any]:
    """The generation modes to fuzz an operation in: invalid requests too where the
    operation takes a query, header or body to get wrong (schemathesis cannot make an
    id that is invalid once in the path; the walk sends those)."""
    operation = json.loads(DOCUMENT.read_text())["paths"][path][method.lower()]
    modes = [GenerationMode.POSITIVE]
    if "parameters" in operation or "requestBody" in operation:
        modes.append(GenerationMode.NEGATIVE)
    return [pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
            for mode in modes]


def short_wait(case: Any, high: float = 300) -> None:
    """Give a wait a timeout of at most :data:`FUZZ_WAIT_SECONDS`: set it when absent,
    lower it when valid and longer, and leave an invalid one as drawn."""
    timeout = case.query.get("timeout") if case.query else None
    if timeout is None:
        case.query = {**(case.query or {}), "timeout": FUZZ_WAIT_SECONDS}
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool) \
            and 0 <= timeout <= high:
        case.query["timeout"] = min(timeout, FUZZ_WAIT_SECONDS)


@pytest.fixture
def known_ids(api_url: str) -> list[str]:
    """Partitions of the test's own (percent-encoded ids): one open, one cancelled, with
    JSON data and bytes at two gates. Drawn ids seldom name a partition that exists."""
    prefix = f"known-{uuid.uuid4().hex[:8]}"
    ids = [quote(f"{prefix}-open", safe=""), quote(f"{prefix}/cancelled", safe="")]
    items = [{"id": "json", "data": {"n": [1, None]}}, {"id": "bytes", "data_b64": "TmFO"},
             {"id": "later", "gate": 1, "data": "x"}]
    with httpx.Client(base_url=api_url, timeout=REQUEST_TIMEOUT) as client:
        for partition_id in ids:
            created = client.put(f"v1/partitions/{partition_id}",
                                 json={"items": items, "reduce_gates": [1]})
            assert created.status_code == 201, created.text
        assert client.post(f"v1/partitions/{ids[1]}/cancel").status_code == 200
    return ids


def cases(operation: Any, mode: GenerationMode, known_ids: list[str]) -> Any:
    """Requests for ``operation``: half with a drawn id, half with a known one."""
    drawn = operation.as_strategy(generation_mode=mode)
    if "{id}" not in operation.path:
        return drawn
    return st.one_of(drawn, st.sampled_from(known_ids).flatmap(
        lambda partition_id: operation.as_strategy(
            generation_mode=mode, path_parameters={"id": partition_id})))


@pytest.mark.parametrize(("method", "path", "mode"),
                         [param for route in DOCUMENTED for param in fuzzed(*route)])
def test_fuzzed_requests_are_answered_as_documented(
        api_url: str, api_schema: Any, known_ids: list[str], method: str, path: str,
        mode: GenerationMode, monkeypatch: pytest.MonkeyPatch) -> None:
    from processor.api import completions

    # A drawn token is unknown: without this, each would be looked up again for 2 s
    # (the grace an early completion gets, tested in test_waits_early.py).
    monkeypatch.setattr(completions, "NOT_YET_GRACE", 0.0)
    operation = api_schema[path][method]
    base_url = api_url.rstrip("/")
    checks = CHECKS[mode]

    @given(case=cases(operation, mode, known_ids))
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def exchange(case: Any) -> None:
        if path.endswith("/wait"):
            short_wait(case)
        elif path.endswith("/events"):  # a feed lasts until the end, or its timeout
            short_wait(case, high=86_400)
        case.call_and_validate(base_url=base_url, checks=checks, timeout=REQUEST_TIMEOUT)

    exchange()
