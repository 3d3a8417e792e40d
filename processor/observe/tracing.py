"""OpenTelemetry tracing of handler calls (optional: ``pip install 'statefeed[otel]'``).

- The client stores its caller's W3C trace context (``traceparent`` and
  ``tracestate``, as JSON) with a partition it creates (:func:`capture_context`);
  the ingest API stores the one its request carried (:func:`context_from_headers`).
- The engine makes every handler call a span (:class:`watcher.dispatch.spans.CallSpans`),
  linked to that stored context; the HTTP processors take theirs from
  :func:`resolve`.

- A completion of a wait (the API's route, the client, ``processor complete``, the
  console) is the span ``statefeed.complete``, a child of the completer's current span,
  linked to the span of the handler call that parked the item, whose ``traceparent``
  its wait stored (:func:`completion_spans`, :func:`record_completion`).

Tracing is on when the application set a tracer provider (library mode), or when
``processor run`` finds ``OTEL_TRACES_EXPORTER`` (:func:`configure_from_env`); it
is decided once, at start-up. Off, nothing here imports OpenTelemetry, and the
engine calls the processor's own functions.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from watcher.dispatch.spans import (
    GATE,
    INSTALL_HINT,
    ITEM,
    OUTCOME,
    PARTITION,
    CallSpans,
    configured_spans,
    encode_context,
    import_trace,
    traceparent_of,
)
from watcher.errors import ConfigError
from watcher.records import PartitionSettings

if TYPE_CHECKING:
    from watcher.store.waits import CompletedWait

__all__ = ["CallSpans", "capture_context", "completion_spans", "configure_from_env",
           "configured_spans", "context_from_headers", "current_traceparent",
           "encode_context", "exporter_names", "record_completion", "resolve",
           "traced_settings"]

COMPLETION_SPAN = "statefeed.complete"
# A completion's new item status, on its span.
STATUS = "statefeed.status"


def context_from_headers(headers: Mapping[str, str]) -> str | None:
    """The trace context an incoming request carries (``traceparent`` and
    ``tracestate`` headers), in its stored form; ``None`` without a valid one."""
    parent = headers.get("traceparent")
    if parent is None:
        return None
    return encode_context({"traceparent": parent, "tracestate": headers.get("tracestate", "")})


def traced_settings(settings: PartitionSettings, headers: Mapping[str, str]
                    ) -> PartitionSettings:
    """``settings`` of a partition the ingest API creates, with the trace context to
    store: the current span's (an instrumented API), else the one the request's
    headers carry, else none."""
    trace_context = capture_context() or context_from_headers(headers)
    return settings if trace_context is None else replace(settings, trace_context=trace_context)


def capture_context() -> str | None:
    """The caller's current trace context in its stored form, or ``None`` when no span
    is current. An application that never loaded OpenTelemetry has none: this then
    imports nothing and costs one dictionary look-up."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return encode_context(carrier)


def current_traceparent() -> str | None:
    """The ``traceparent`` of the caller's current span, or ``None`` when none is (and
    without OpenTelemetry loaded, at the cost of one dictionary look-up)."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    return traceparent_of(trace.get_current_span().get_span_context())


def completion_spans(tracer_provider: Any = None) -> CallSpans | None:
    """What records completion spans: ``tracer_provider``'s when given, else the
    application's global one when it set one (:func:`configured_spans`), else
    ``None`` (tracing off)."""
    if tracer_provider is not None:
        return CallSpans(tracer_provider)
    return configured_spans()


def record_completion(spans: CallSpans, started: int, done: CompletedWait | None = None,
                      error: BaseException | None = None) -> None:
    """Record the span of one completion that began at ``started`` (nanoseconds since
    the epoch): ``statefeed.complete``, a child of the completer's current span, linked
    to the span of the call that parked the item (``done.parked_by``, read with the
    wait: so the span is made once the store answered). Its attributes name the
    partition, the item, its gate and new status; a completion that failed
    (``error``: refused, or the database failed) has none of these and no link.
    Never the token."""
    if done is None:
        from watcher.errors import AlreadyCompletedError, CompletionRefusedError
        from watcher.rules.spawn import SpawnConflictError

        refused = isinstance(error, AlreadyCompletedError | CompletionRefusedError
                             | SpawnConflictError)
        spans.ended_span(COMPLETION_SPAN, started, [], {}, error=error,
                         outcome="refused" if refused else "error")
        return
    spans.ended_span(COMPLETION_SPAN, started, spans.link_to_parent(done.parked_by), {
        PARTITION: done.partition_id, ITEM: done.item_id, GATE: done.gate,
        STATUS: done.status, OUTCOME: "completed"})


def resolve(given: CallSpans | str | None, *, client: bool) -> CallSpans | None:
    """A processor's tracer: ``given``, as one of its kind, or ``"auto"``
    (:func:`configured_spans`)."""
    if given == "auto":
        return configured_spans(client=client)
    if isinstance(given, CallSpans):
        return given.for_http() if client else given
    return None


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The trace exporters ``OTEL_TRACES_EXPORTER`` names, as their entry points are
    named (``otlp`` is ``otlp_proto_http`` unless the OTLP protocol says ``grpc``);
    empty when it is unset or ``none``."""
    names = [name.strip() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [name for name in names if name and name != "none"]
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    otlp = "otlp_proto_grpc" if protocol.strip() == "grpc" else "otlp_proto_http"
    return [otlp if name == "otlp" else name for name in names]


def configure_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """For ``processor run``: when ``OTEL_TRACES_EXPORTER`` names exporters and no tracer
    provider is set yet, set the SDK's (its resource from ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES``, each exporter behind a batch processor). Returns
    whether tracing is on.

    Raises:
        ConfigError: the SDK is not installed (naming the extra), or an exporter named
            is not installed.
    """
    environ = os.environ if environ is None else environ
    names = exporter_names(environ)
    if not names:
        return configured_spans() is not None
    trace = import_trace()
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return True  # set already (opentelemetry-instrument, or the application)
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(f"OTEL_TRACES_EXPORTER is set, and tracing needs the "
                          f"OpenTelemetry SDK: {INSTALL_HINT}") from None
    from importlib.metadata import entry_points

    provider = TracerProvider(resource=Resource.create())
    for name in names:
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            raise ConfigError(f"OTEL_TRACES_EXPORTER names the exporter {name!r}, which is "
                              "not installed (the otel extra has otlp and console)")
        provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
    trace.set_tracer_provider(provider)
    return True
