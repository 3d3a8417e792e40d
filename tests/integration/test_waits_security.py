"""Completion tokens stay secret, on every live database: a park, a completion, a
heartbeat, refused uses and a timeout, driven through a real uvicorn handler and the
API; then no token appears in any log line (text or JSON), the metrics, an error
answer, a console page, ``status --json`` or ``items --show --json``. And the API's
per-address bound on the completion routes answers 429 with Retry-After, counting
refused lookups."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import httpx
import pytest

import handlers
from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.api.upload import Limits
from processor.console.app import create_app, settings_for
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from processor.observe.logs import formatter, setup_logging
from processor.observe.metrics import PrometheusHooks
from tests.conftest import require_extra
from tests.support.engine import running, wait_until
from tests.support.servers import serve_app
from watcher import Watcher, WatcherConfig
from watcher.store.db.urls import parse_database_url

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.1}
UNKNOWN_TOKEN = "B" * 43


class Asker:
    """Gate 0 parks every item (``t`` for 0.5 s, failing at its deadline; the others
    for an hour), keeping each token it was given; gate 1 completes it."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[str]] = {}

    def ask(self, item: handlers.Item) -> handlers.Result:
        self.tokens.setdefault(item.id, []).append(item.completion_token)
        if item.id == "t":
            return handlers.Result(wait={"timeout": 0.5, "on_timeout": "fail"})
        return handlers.Result(wait={"timeout": 3600})

    def done(self, item: handlers.Item) -> handlers.Result:
        return handlers.Result(done=True)


def _cli(db_url: str, table_prefix: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "processor.cli", *args, "--db-url", db_url,
         *(("--table-prefix", table_prefix) if table_prefix else ())],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()}, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


async def test_no_completion_token_leaks_anywhere(
        db_url, table_prefix, make_store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem(name, b"1") for name in ("a", "b", "t")],
                                  on_item_failure="continue")
    asker = Asker()
    app = handlers.app({0: asker.ask, 1: asker.done})
    url = parse_database_url(db_url)
    seen: list[str] = []
    options = ApiOptions(url, table_prefix, port=0)
    async with serve_app(app) as handler_url, api_running(options) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        processor = HttpProcessor(HttpProcessorConfig(handler_url=f"{handler_url}/"))
        try:
            async with running(Watcher(make_store(), processor,
                                       WatcherConfig(owner_id="w1", **FAST))):
                async def parked() -> bool:
                    return {"a", "b"} <= set(asker.tokens) and len(
                        await client.items("p", status="waiting")) >= 2
                await wait_until(parked, message="a and b parked")
                token_a, token_b = asker.tokens["a"][-1], asker.tokens["b"][-1]
                bad = await http.post(f"v1/completions/{token_b}", json={"gate": "x"})
                assert bad.status_code == 400
                beat = await http.post(f"v1/completions/{token_b}/heartbeat",
                                       json={"timeout": 600})
                assert beat.status_code == 200
                done = await http.post(f"v1/completions/{token_a}", json={"gate": 1})
                assert done.status_code == 200
                again = await http.post(f"v1/completions/{token_a}", json={})
                assert again.status_code == 409
                unknown = await http.post(f"v1/completions/{UNKNOWN_TOKEN}", json={})
                assert unknown.status_code == 404
                seen += [bad.text, beat.text, done.text, again.text, unknown.text]

                async def timed_out() -> bool:
                    return (await client.item("p", "t")).status == "failed"
                await wait_until(timed_out, message="t timed out")
                seen.append((await http.get("v1/partitions/p")).text)
                seen.append((await http.get("v1/partitions/p/items")).text)
                hooks = PrometheusHooks()
                hooks.backlog(await make_store().backlog_read(1000))
                metrics = hooks.render().decode()
                assert "statefeed_items_parked 1.0" in metrics
                seen.append(metrics)
                async with AsyncClient(url, table_prefix) as console_client:
                    console = create_app(settings_for(
                        url, table_prefix, host="127.0.0.1", port=8090, token=None,
                        read_only=False), console_client)
                    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console),
                                                 base_url="http://127.0.0.1:8090") as web:
                        for path in ("/", "/partitions", "/partition?id=p",
                                     "/item?partition=p&id=a", "/item?partition=p&id=b",
                                     "/item?partition=p&id=t"):
                            page = await web.get(path)
                            assert page.status_code == 200, path
                            seen.append(page.text)
                status = _cli(db_url, table_prefix, "status", "--json")
                assert '"waiting": {' in status and '"by_gate": {' in status
                seen.append(status)
                table = _cli(db_url, table_prefix, "status")
                assert "p: 1 waiting (gate 0: 1); the oldest for" in table
                seen.append(table)
                seen.append(_cli(db_url, table_prefix, "items", "p", "--show", "b", "--json"))
                seen.append(_cli(db_url, table_prefix, "items", "p", "--status", "waiting"))
        finally:
            await processor.aclose()
    await client.close()
    tokens = [token for given in asker.tokens.values() for token in given]
    assert len(tokens) >= 3
    # The test's own HTTP client logs each URL (a completion's holds its token) at INFO
    # and DEBUG; `processor`'s logging setup keeps httpx at WARNING, checked below.
    records = [record for record in caplog.records
               if not record.name.startswith(("httpx", "httpcore"))]
    root, httpx_logger = logging.getLogger(), logging.getLogger("httpx")
    kept = (root.handlers[:], root.level, httpx_logger.level)
    try:
        setup_logging("INFO", "text")
        assert httpx_logger.getEffectiveLevel() >= logging.WARNING
    finally:
        root.handlers[:], httpx_logger.level = kept[0], kept[2]
        root.setLevel(kept[1])
    assert any("action=wait_timed_out" in record.getMessage() for record in records)
    assert any("action=wait_completed" in record.getMessage() for record in records)
    lines = [formatter(kind).format(record) for record in records for kind in ("text", "json")]
    for token in tokens:
        for text in [*seen, *lines]:
            assert token not in text


async def test_the_completion_routes_are_bounded_per_address(
        db_url, table_prefix, monkeypatch: pytest.MonkeyPatch) -> None:
    from processor.api import completions

    # Each guess is unknown: without this, each would be looked up again for 2 s (the
    # grace an early completion gets, tested in test_waits_early.py).
    monkeypatch.setattr(completions, "NOT_YET_GRACE", 0.0)
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0,
                         limits=Limits(completions_per_minute=3))
    async with api_running(options) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        for _ in range(3):
            guess = await http.post(f"v1/completions/{UNKNOWN_TOKEN}", json={})
            assert guess.status_code == 404
        refused = await http.post(f"v1/completions/{UNKNOWN_TOKEN}/heartbeat",
                                  json={"timeout": 5})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_requests"
        assert 1 <= int(refused.headers["retry-after"]) <= 20
        other = await http.get("v1/partitions")
        assert other.status_code == 200, "the other routes are not bounded"


async def test_guesses_sent_at_once_get_at_most_the_bound_of_404s(
        db_url, table_prefix, make_store) -> None:
    # Each unknown token is looked up again for up to 2 s before its 404 (an early
    # completion's grace, kept here): guesses sent together must still be counted as
    # they arrive. A real completion from another address goes through meanwhile.
    import asyncio
    import secrets
    import time

    from tests.integration.test_waits import Parker, config

    rate, guesses = 10, 60
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("real", b"1")])
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0,
                         limits=Limits(completions_per_minute=rate))
    guesser = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with running(Watcher(make_store(), parker, config())), \
            api_running(options) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=60, transport=guesser,
                              limits=httpx.Limits(max_connections=guesses)) as http, \
            httpx.AsyncClient(base_url=api_url, timeout=60) as honest:
        await wait_until(lambda: _parked(client, 1), message="one parked")
        started = time.monotonic()
        answers = await asyncio.gather(
            *(http.post(f"v1/completions/{secrets.token_urlsafe(32)}", json={"gate": 1})
              for _ in range(guesses)),
            honest.post(f"v1/completions/{parker.token('real')}", json={"gate": 1}))
        elapsed = time.monotonic() - started
    await client.close()
    *guessed, real = answers
    assert real.status_code == 200, real.text
    codes = [answer.status_code for answer in guessed]
    assert set(codes) <= {404, 429}, codes
    # The burst, plus what the bucket refilled while they were answered (one every
    # 60/rate s), plus one for a refill landing between two of them.
    bound = rate + int(elapsed * rate / 60) + 1
    assert codes.count(404) <= bound, (codes.count(404), bound, elapsed)
    assert codes.count(404) >= 1, "the bucket let no lookup through"
    for answer in guessed:
        if answer.status_code == 429:
            assert answer.json()["error"]["code"] == "too_many_requests"
            assert int(answer.headers["retry-after"]) >= 1


async def test_real_completions_are_never_throttled(db_url, table_prefix, make_store) -> None:
    from tests.integration.test_waits import Parker, config

    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem(f"i{n}", b"1") for n in range(6)])
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0,
                         limits=Limits(completions_per_minute=2))
    async with running(Watcher(make_store(), parker, config())), \
            api_running(options) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        await wait_until(lambda: _parked(client, 6), message="six parked")
        for n in range(6):  # three times the bound, all from one address
            token = parker.token(f"i{n}")
            beat = await http.post(f"v1/completions/{token}/heartbeat", json={"timeout": 60})
            assert beat.status_code == 200, beat.text
            done = await http.post(f"v1/completions/{token}", json={"gate": 1})
            assert done.status_code == 200, done.text
            again = await http.post(f"v1/completions/{token}", json={"gate": 1})
            assert again.status_code == 409, "a known token's refusal spends nothing"
    await client.close()


async def _parked(client: AsyncClient, count: int) -> bool:
    return sum(item.status == "waiting" for item in await client.items("p")) == count


async def test_an_instrumented_api_names_the_completed_item_on_its_span(
        db_url, table_prefix, make_store) -> None:
    require_extra("opentelemetry.sdk.trace", "otel", "an instrumented API's span")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from processor.api.server import create_app
    from tests.integration.test_waits import Parker, config

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1")])
    async with running(Watcher(make_store(), parker, config())):
        async def parked() -> bool:
            return len(await client.items("p", status="waiting")) == 1
        await wait_until(parked, message="parked")
        app = create_app(ApiOptions(parse_database_url(db_url), table_prefix, port=0), client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as http:
            with provider.get_tracer("test").start_as_current_span("POST /v1/completions"):
                done = await http.post(f"/v1/completions/{parker.token('a')}",
                                       json={"gate": 1})
            assert done.status_code == 200, done.text
    [span] = exporter.get_finished_spans()
    assert dict(span.attributes or {}) == {
        "statefeed.partition": "p", "statefeed.item": "a", "statefeed.gate": 1,
        "statefeed.status": "available"}
    await client.close()
