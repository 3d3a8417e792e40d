"""OpenTelemetry spans of handler calls, made by the engine when tracing is on.

:class:`CallSpans` makes every handler call a span: one per item call, per batch call
and per reduce call (each page). Each is the root of a trace of its own, *linked* to
the context the partition's creator stored, so a partition of a million items is not
one trace of a million spans (docs/how-to/trace.md says why). Over HTTP the request
carries the span as a W3C ``traceparent`` header, so an instrumented handler's server
span is its child.

OpenTelemetry is optional (``pip install 'statefeed[otel]'``): nothing here imports it
until a tracer is made, and :func:`configured_spans` makes one only when the
application has loaded OpenTelemetry and set a tracer provider. The service's side of
tracing (what the client and the API store, the exporters ``processor run`` sets up)
is :mod:`processor.observe.tracing`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from watcher.dispatch.tracing import PROCESSOR_TRACER, CallTracer, PartitionCalls
from watcher.errors import ConfigError
from watcher.protocol import (
    NonRetryableError,
    ReduceCall,
    ReduceResult,
    Result,
    WorkItem,
)

INSTALL_HINT = "install the otel extra: pip install 'statefeed[otel]'"
TRACER_NAME = "statefeed"
# What W3C Trace Context version 00 allows (an all-zero trace or span id is invalid).
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
# The W3C limit of a tracestate header (32 members of at most 256 characters, and commas).
MAX_TRACESTATE = 8224
# An error's text on a span stops here: a span is not the place for a whole body.
MAX_STATUS_TEXT = 500

# Span attributes (one name per meaning; docs/how-to/trace.md lists them).
PARTITION = "statefeed.partition"
PIPELINE = "statefeed.pipeline"
ITEM = "statefeed.item"
ITEMS = "statefeed.items"
GATE = "statefeed.gate"
ATTEMPT = "statefeed.attempt"
OUTCOME = "statefeed.outcome"
FAILED_ITEMS = "statefeed.failed_items"
REDUCE_PASS = "statefeed.reduce.pass"
REDUCE_PAGE = "statefeed.reduce.page"


def encode_context(carrier: Mapping[str, str]) -> str | None:
    """The stored form of a W3C trace context: ``{"traceparent": ..., "tracestate": ...}``
    as JSON, or ``None`` when ``carrier`` holds no valid ``traceparent``."""
    parent = carrier.get("traceparent", "").strip().lower()
    if not _TRACEPARENT.fullmatch(parent):
        return None
    stored = {"traceparent": parent}
    state = carrier.get("tracestate", "").strip()
    if state and len(state) <= MAX_TRACESTATE and state.isascii():
        stored["tracestate"] = state
    return json.dumps(stored, separators=(",", ":"))


def decode_context(stored: str | None) -> dict[str, str] | None:
    """The carrier :func:`encode_context` stored (``None`` for none, or for a text that
    is not one: a context is a hint, never a reason to fail a call)."""
    if not stored:
        return None
    try:
        carrier = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(carrier, dict) or not all(isinstance(value, str)
                                                for value in carrier.values()):
        return None
    return carrier if encode_context(carrier) is not None else None


def traceparent_of(span_context: Any) -> str | None:
    """The W3C ``traceparent`` (version 00) of an OpenTelemetry span context, or
    ``None`` for an invalid one."""
    if not span_context.is_valid:
        return None
    return (f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{int(span_context.trace_flags):02x}")


def note_parked(item: WorkItem, answer: object, span: Any) -> None:
    """When ``answer`` parks ``item``, note ``span`` on it: its wait stores the span's
    ``traceparent``, and the completion's span links to it."""
    if isinstance(answer, Result) and answer.wait is not None:
        item.note_call_span(traceparent_of(span.get_span_context()))


def item_outcome(answer: object) -> str:
    """What a call's answer (a result, or the exception it raised) did, as a span says
    it: ``done``, ``next_gate``, ``again``, ``retryable_error``, ``error`` (for good) or
    ``cancelled``."""
    if isinstance(answer, Result):
        if answer.done:
            return "done"
        return "again" if answer.gate is None else "next_gate"
    if isinstance(answer, NonRetryableError):
        return "error"
    if isinstance(answer, BaseException) and not isinstance(answer, Exception):
        return "cancelled"
    return "retryable_error" if isinstance(answer, BaseException) else "answered"


def _installed_version() -> str | None:
    """statefeed's installed version (the tracer's), or ``None`` when not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("statefeed")
    except PackageNotFoundError:
        return None


def import_trace() -> Any:
    """``opentelemetry.trace``.

    Raises:
        ConfigError: OpenTelemetry is not installed; the message names the extra.
    """
    try:
        from opentelemetry import trace
    except ImportError:
        raise ConfigError(f"tracing needs OpenTelemetry: {INSTALL_HINT}") from None
    return trace


class CallSpans:
    """Makes a span of every handler call (a :class:`~watcher.dispatch.tracing.CallTracer`).

    ``tracer_provider`` defaults to the application's global one; ``client`` makes the
    spans of the kind CLIENT (calls over HTTP) rather than INTERNAL (library mode).

    Raises:
        ConfigError: (on construction) OpenTelemetry is not installed.
    """

    def __init__(self, tracer_provider: Any = None, *, client: bool = False) -> None:
        trace = import_trace()
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self.tracer_provider = tracer_provider or trace.get_tracer_provider()
        self._tracer = self.tracer_provider.get_tracer(TRACER_NAME, _installed_version())
        self._kind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
        self._root = Context()  # every call span starts a trace of its own
        self._propagator = TraceContextTextMapPropagator()

    def for_http(self) -> CallSpans:
        """These spans as the HTTP processors make them: of the kind CLIENT."""
        return CallSpans(self.tracer_provider, client=True)

    def link_to(self, stored: str | None) -> list[Any]:
        """The span links to a stored context: one, or none without a valid one."""
        return self._links(decode_context(stored))

    def link_to_parent(self, traceparent: str | None) -> list[Any]:
        """The span links to a stored bare ``traceparent`` (a wait's): one, or none."""
        return self._links({"traceparent": traceparent} if traceparent else None)

    def _links(self, carrier: dict[str, str] | None) -> list[Any]:
        """The span links to the context ``carrier`` holds: one, or none."""
        if carrier is None or encode_context(carrier) is None:
            return []
        context = self._propagator.extract(carrier)
        span_context = self._trace.get_current_span(context).get_span_context()
        return [self._trace.Link(span_context)] if span_context.is_valid else []

    def ended_span(self, name: str, started: int, links: Sequence[Any],
                   attributes: Mapping[str, Any], *, error: BaseException | None = None,
                   outcome: str | None = None) -> None:
        """Record a span ``name`` that began at ``started`` (nanoseconds since the
        epoch) and ends now: a child of the current span (not a root of its own),
        linked to ``links``; ``error`` marks it failed, with ``outcome``."""
        span = self._tracer.start_span(name, kind=self._trace.SpanKind.INTERNAL,
                                       attributes=attributes, links=links,
                                       start_time=started, record_exception=False,
                                       set_status_on_exception=False)
        if error is not None:
            self.failed(span, error, outcome=outcome)
        span.end()

    def inject(self, headers: dict[str, str]) -> None:
        """Add the current span's ``traceparent`` (and ``tracestate``) to ``headers``."""
        self._propagator.inject(headers)

    def current_span_context(self) -> Any:
        """The current span's context (what a batch request links to), or ``None``."""
        span_context = self._trace.get_current_span().get_span_context()
        return span_context if span_context.is_valid else None

    @contextmanager
    def span(self, name: str, links: Sequence[Any], attributes: Mapping[str, Any], *,
             kind: Any = None) -> Iterator[Any]:
        """A current span ``name`` for the block, a root linked to ``links``; ended with
        the block. An exception leaving the block sets it to error (and goes on)."""
        span = self._tracer.start_span(name, context=self._root, kind=kind or self._kind,
                                       attributes=attributes, links=links,
                                       record_exception=False, set_status_on_exception=False)
        with self._trace.use_span(span, end_on_exit=True, record_exception=False,
                                  set_status_on_exception=False):
            try:
                yield span
            except BaseException as error:
                self.failed(span, error)
                raise

    def failed(self, span: Any, error: BaseException, *, outcome: str | None = None) -> None:
        """Mark ``span`` failed by ``error``: its outcome, status and exception event."""
        span.set_attribute(OUTCOME, outcome or item_outcome(error))
        if isinstance(error, Exception):
            span.record_exception(error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR,
                                               str(error)[:MAX_STATUS_TEXT]))

    def answered(self, span: Any, failed: int, count: int) -> None:
        """A batch call answered, ``failed`` of its ``count`` items with an error."""
        span.set_attribute(OUTCOME, "answered")
        span.set_attribute(FAILED_ITEMS, failed)
        if failed:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR,
                                               f"{failed} of {count} items failed"))

    def wrap(self, trace_context: str | None, calls: PartitionCalls) -> PartitionCalls:
        """See :meth:`watcher.dispatch.tracing.CallTracer.wrap`: each call a span linked to
        the partition's stored ``trace_context``."""
        links = self.link_to(trace_context)
        process, process_batch, reduce = calls

        async def traced_process(item: WorkItem) -> Result:
            with self.span("statefeed.process", links, {
                    PARTITION: item.partition_id, PIPELINE: item.pipeline, ITEM: item.id,
                    GATE: item.gate, ATTEMPT: item.attempt}) as span:
                result = await process(item)
                span.set_attribute(OUTCOME, item_outcome(result))
                note_parked(item, result, span)
                return result

        async def traced_batch(items: Sequence[WorkItem]) -> Sequence[Result | Exception]:
            assert process_batch is not None
            first = items[0]
            with self.span("statefeed.process_batch", links, {
                    PARTITION: first.partition_id, PIPELINE: first.pipeline, GATE: first.gate,
                    ITEMS: len(items), ATTEMPT: max(item.attempt for item in items)}) as span:
                answers = await process_batch(items)
                self.answered(span, sum(isinstance(answer, BaseException)
                                        for answer in answers), len(items))
                for item, answer in zip(items, answers, strict=False):
                    note_parked(item, answer, span)
                return answers

        async def traced_reduce(call: ReduceCall) -> ReduceResult:
            assert reduce is not None
            with self.span("statefeed.reduce", links, {
                    PARTITION: call.partition_id, PIPELINE: call.pipeline, GATE: call.gate,
                    ATTEMPT: call.attempt, REDUCE_PASS: call.pass_, REDUCE_PAGE: call.page,
                    ITEMS: len(call.items)}) as span:
                answer = await reduce(call)
                span.set_attribute(OUTCOME, "answered")
                return answer

        return PartitionCalls(traced_process,
                              traced_batch if process_batch is not None else None,
                              traced_reduce if reduce is not None else None)

    @contextmanager
    def batch_request(self, links: Sequence[Any], count: int) -> Iterator[Any]:
        """The span of one batch request over HTTP (kind CLIENT), linked to the spans
        of the item calls it carries (``links``: their span contexts)."""
        with self.span("statefeed.http_batch",
                       [self._trace.Link(context) for context in links if context],
                       {ITEMS: count}, kind=self._trace.SpanKind.CLIENT) as span:
            yield span


def configured_spans(*, client: bool = False) -> CallSpans | None:
    """The start-up decision: :class:`CallSpans` when OpenTelemetry is loaded and the
    application set a tracer provider, else ``None`` (tracing off)."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    trace = import_trace()
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return CallSpans(provider, client=client)


def find_tracer(processor: Any) -> CallTracer | None:
    """The tracer a watcher uses for ``processor``, decided once at start-up.

    A processor with a ``call_tracer`` attribute decides for itself (an
    :class:`~processor.http.processor.HttpProcessor` does). Otherwise tracing is on
    when OpenTelemetry is loaded and the application set a tracer provider
    (:func:`watcher.dispatch.spans.configured_spans`), which imports OpenTelemetry only then.
    """
    if hasattr(processor, PROCESSOR_TRACER):
        tracer: CallTracer | None = getattr(processor, PROCESSOR_TRACER)
        return tracer
    if "opentelemetry.trace" not in sys.modules:
        return None
    return configured_spans()
