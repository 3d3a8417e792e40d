"""The engine's seam for tracing handler calls: a tracer wraps a partition's calls.

The seam itself knows nothing of OpenTelemetry. When a :class:`CallTracer` is set, each
partition's supervisor hands it the partition's calls (``process``, the optional
``process_batch`` and ``reduce``) with the trace context its creator stored, once per
lease, and calls what it gets back. Without one, the calls are the processor's own:
tracing off costs the hot path nothing. :class:`watcher.dispatch.spans.CallSpans` is the
OpenTelemetry implementation.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

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
