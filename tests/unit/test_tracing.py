"""The pure parts of processor/observe/tracing.py: the stored form of a trace context, what an
incoming request's headers give, how a call's answer is named on its span, which
exporters OTEL_TRACES_EXPORTER names; and that tracing off imports nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from processor.observe.tracing import context_from_headers, exporter_names
from watcher.dispatch.spans import decode_context, encode_context, item_outcome
from watcher.errors import ConfigError
from watcher.protocol import NonRetryableError, Result, RetryableError

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("carrier", "stored"), [
    ({"traceparent": PARENT}, {"traceparent": PARENT}),
    ({"traceparent": PARENT, "tracestate": "a=1,b=2"},
     {"traceparent": PARENT, "tracestate": "a=1,b=2"}),
    ({"traceparent": " " + PARENT.upper() + " ", "tracestate": ""}, {"traceparent": PARENT}),
    ({"traceparent": PARENT, "tracestate": "x" * 9000}, {"traceparent": PARENT}),
    ({"traceparent": PARENT, "tracestate": "é=1"}, {"traceparent": PARENT}),
])
def test_a_valid_traceparent_is_stored_with_a_tracestate_that_fits(
        carrier: dict[str, str], stored: dict[str, str]) -> None:
    text = encode_context(carrier)
    assert text is not None and json.loads(text) == stored
    assert decode_context(text) == stored


@pytest.mark.parametrize("parent", [
    "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # another version
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # an all-zero span id
    "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  # not hex
    PARENT + "-extra",
])
def test_an_invalid_traceparent_stores_nothing(parent: str) -> None:
    assert encode_context({"traceparent": parent}) is None
    assert context_from_headers({"traceparent": parent}) is None


@pytest.mark.parametrize("stored", [None, "", "not json", "[1]", '{"traceparent": 1}',
                                    '{"traceparent": "00-x"}'])
def test_a_stored_text_that_is_not_a_context_reads_as_none(stored: str | None) -> None:
    assert decode_context(stored) is None


def test_the_headers_of_a_request_give_its_context() -> None:
    assert context_from_headers({}) is None
    assert json.loads(context_from_headers({"traceparent": PARENT, "tracestate": "k=v"})
                      or "") == {"traceparent": PARENT, "tracestate": "k=v"}


@pytest.mark.parametrize(("answer", "outcome"), [
    (Result(done=True), "done"),
    (Result(gate=2), "next_gate"),
    (Result(), "again"),
    (RetryableError("later"), "retryable_error"),
    (ValueError("a bug"), "retryable_error"),  # the engine retries any other exception
    (NonRetryableError("never"), "error"),
    (KeyboardInterrupt(), "cancelled"),
    ("not a result", "answered"),
])
def test_a_calls_answer_is_named_as_the_engine_treats_it(answer: object, outcome: str) -> None:
    assert item_outcome(answer) == outcome


@pytest.mark.parametrize(("environ", "names"), [
    ({}, []),
    ({"OTEL_TRACES_EXPORTER": "none"}, []),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_http"]),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     ["otlp_proto_grpc"]),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, ["otlp_proto_http"]),
    ({"OTEL_TRACES_EXPORTER": " otlp , console "}, ["otlp_proto_http", "console"]),
])
def test_the_exporters_otel_traces_exporter_names(environ: dict[str, str],
                                                  names: list[str]) -> None:
    assert exporter_names(environ) == names


def test_tracing_asked_for_without_opentelemetry_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from processor.observe.tracing import CallSpans

    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'statefeed\[otel\]'"):
        CallSpans()


def test_with_tracing_off_nothing_imports_opentelemetry(tmp_path: Path) -> None:
    """A partition created and processed, in library mode and over HTTP, in a process
    that never loaded OpenTelemetry: it is still not loaded (installed or not)."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        from processor import AsyncClient, NewItem
        from processor.http.config import HttpProcessorConfig
        from processor.http.processor import HttpProcessor
        from processor.http.batch import BatchingHttpProcessor
        from watcher import Result, Store, Watcher, WatcherConfig
        from watcher.store.db.migrate import upgrade

        async def process(item):
            return Result(done=True)

        async def main():
            db = "sqlite:///{tmp_path / 'off.db'}"
            upgrade(db)
            config = HttpProcessorConfig(handler_url="http://127.0.0.1:9/")
            assert HttpProcessor(config).call_tracer is None
            assert BatchingHttpProcessor(config, batch_size=2).call_tracer is None
            async with AsyncClient(db) as client:
                await client.create_partition("p", [NewItem("a", b"x")])
                watcher = Watcher(Store.open(db), process,
                                  WatcherConfig(poll_interval=0.05, lease_duration=3))
                running = asyncio.create_task(watcher.run())
                info = await client.wait("p", timeout=30)
                await watcher.stop()
                await running
            assert info.status == "complete", info
            loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
            assert not loaded, loaded
            print("ok")

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
