"""The engine's seam for tracing handler calls: a tracer wraps a partition's calls.

The engine knows nothing of OpenTelemetry. When a :class:`CallTracer` is set, each
partition's supervisor hands it the partition's calls (``process``, the optional
``process_batch`` and ``reduce``) with the trace context its creator stored, once per
lease, and calls what it gets back. Without one, the calls are the processor's own:
tracing off costs the hot path nothing. :class:`watcher.spans.CallSpans` is the
OpenTelemetry implementation.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, Protocol

from watcher.protocol import ProcessBatchCall, ProcessCall, ReduceCallable

# The attribute by which a processor says how its calls are traced (an HttpProcessor's
# ``call_tracer``: the tracer it injects ``traceparent`` for, or ``None`` for none).
PROCESSOR_TRACER = "call_tracer"


class PartitionCalls(NamedTuple):
    """The calls the engine makes for one partition."""

    process: ProcessCall
    process_batch: ProcessBatchCall | None
    reduce: ReduceCallable | None


class CallTracer(Protocol):
    """Wraps a partition's calls so that each one is traced."""

    def wrap(self, trace_context: str | None, calls: PartitionCalls) -> PartitionCalls:
        """``calls``, each traced; ``trace_context`` is what the partition's creator
        stored (W3C ``traceparent``/``tracestate`` as JSON), or ``None``."""
        ...


def find_tracer(processor: Any) -> CallTracer | None:
    """The tracer a watcher uses for ``processor``, decided once at start-up.

    A processor with a ``call_tracer`` attribute decides for itself (an
    :class:`~processor.http_processor.HttpProcessor` does). Otherwise tracing is on
    when OpenTelemetry is loaded and the application set a tracer provider
    (:func:`watcher.spans.configured_spans`), which imports OpenTelemetry only then.
    """
    if hasattr(processor, PROCESSOR_TRACER):
        tracer: CallTracer | None = getattr(processor, PROCESSOR_TRACER)
        return tracer
    if "opentelemetry.trace" not in sys.modules:
        return None
    from watcher.spans import configured_spans

    return configured_spans()
