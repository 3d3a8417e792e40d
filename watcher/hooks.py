"""Observation hooks: the engine reports state changes here, never waiting on them.

:class:`Hooks` does nothing; :class:`CountingHooks` counts events (tests and
``status``); the Prometheus metrics of the processor service implement the
same interface. A hook that raises is logged and ignored.

The hooks of an item's or a partition's progress (:data:`PIPELINE_HOOKS`) also take
the partition's ``pipeline`` as a keyword. An override written before they did (no
``pipeline`` parameter and no ``**kwargs``) is still called, without it, through
:class:`SafeHooks`, which the watcher wraps every hooks object in.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from watcher.records import DEFAULT_PIPELINE

log = logging.getLogger(__name__)

# The hooks the engine passes ``pipeline=`` (the partition's pipeline) to.
PIPELINE_HOOKS = frozenset({"item_dispatched", "item_outcome", "stale_result",
                            "items_spawned", "gate_advanced", "partition_closed",
                            "reduce_outcome"})


class Hooks:
    """Every event the engine reports. Override what you need; keep it fast."""

    def lease_acquired(self, partition_id: str, *, stolen_from: str | None) -> None: ...
    def lease_released(self, partition_id: str) -> None: ...
    def lease_lost(self, partition_id: str) -> None: ...
    # Released to a processor that asked for it, its calls in flight written first.
    def lease_handed_over(self, partition_id: str) -> None: ...
    def lease_conflict(self, partition_id: str) -> None: ...
    # An item's and a partition's progress; ``pipeline`` is the partition's.
    def item_dispatched(self, partition_id: str, item_id: str, gate: int, *,
                        pipeline: str = DEFAULT_PIPELINE) -> None: ...
    def item_outcome(self, partition_id: str, item_id: str, gate: int, outcome: str,
                     seconds: float, *, pipeline: str = DEFAULT_PIPELINE) -> None: ...
    def stale_result(self, partition_id: str, item_id: str, *,
                     pipeline: str = DEFAULT_PIPELINE) -> None: ...
    def items_spawned(self, partition_id: str, count: int, *,
                      pipeline: str = DEFAULT_PIPELINE) -> None: ...
    def gate_advanced(self, partition_id: str, from_gate: int, to_gate: int, *,
                      pipeline: str = DEFAULT_PIPELINE) -> None: ...
    def partition_closed(self, partition_id: str, status: str, *,
                         pipeline: str = DEFAULT_PIPELINE) -> None: ...
    def reduce_outcome(self, partition_id: str, gate: int, pass_: str, outcome: str,
                       seconds: float, *, pipeline: str = DEFAULT_PIPELINE) -> None: ...
    def leases_held(self, count: int) -> None: ...
    def in_flight(self, count: int) -> None: ...
    # Flow control. A limited key's calls in flight at this processor, the slots its
    # grant holds and the key's limit, each time the grant is written:
    def key_grant(self, key: str, in_flight: int, granted: int, limit: int) -> None: ...
    # Calls held back: by a rate limit ("rate") or a handler's Retry-After ("block"),
    # of the handler or of a key (scope "handler" or "key").
    def calls_throttled(self, scope: str, reason: str, count: int) -> None: ...
    # A handler answered Retry-After: every processor holds its calls for ``seconds``.
    def handler_blocked(self, seconds: float) -> None: ...


class CountingHooks(Hooks):
    """Counts events by name (``counts["lease_acquired"]``) and outcomes by kind."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()

    def lease_acquired(self, partition_id: str, *, stolen_from: str | None) -> None:
        self.counts["lease_stolen" if stolen_from else "lease_acquired"] += 1

    def lease_released(self, partition_id: str) -> None:
        self.counts["lease_released"] += 1

    def lease_lost(self, partition_id: str) -> None:
        self.counts["lease_lost"] += 1

    def lease_handed_over(self, partition_id: str) -> None:
        self.counts["lease_handed_over"] += 1

    def lease_conflict(self, partition_id: str) -> None:
        self.counts["lease_conflict"] += 1

    def item_outcome(self, partition_id: str, item_id: str, gate: int, outcome: str,
                     seconds: float, *, pipeline: str = DEFAULT_PIPELINE) -> None:
        self.outcomes[outcome] += 1

    def stale_result(self, partition_id: str, item_id: str, *,
                     pipeline: str = DEFAULT_PIPELINE) -> None:
        self.counts["stale_result"] += 1

    def items_spawned(self, partition_id: str, count: int, *,
                      pipeline: str = DEFAULT_PIPELINE) -> None:
        self.counts["items_spawned"] += count

    def gate_advanced(self, partition_id: str, from_gate: int, to_gate: int, *,
                      pipeline: str = DEFAULT_PIPELINE) -> None:
        self.counts["gate_advanced"] += 1

    def partition_closed(self, partition_id: str, status: str, *,
                         pipeline: str = DEFAULT_PIPELINE) -> None:
        self.counts[f"partition_{status}"] += 1

    def reduce_outcome(self, partition_id: str, gate: int, pass_: str, outcome: str,
                       seconds: float, *, pipeline: str = DEFAULT_PIPELINE) -> None:
        self.counts[f"reduce_{outcome}"] += 1


def overrides(hooks: Hooks | SafeHooks, name: str) -> bool:
    """Whether ``hooks`` (or the hooks a :class:`SafeHooks` wraps) does more than the
    base class's no-op for the hook ``name``."""
    if isinstance(hooks, SafeHooks):
        hooks = hooks.wrapped
    return getattr(type(hooks), name, None) is not getattr(Hooks, name, None)


class SafeHooks:
    """Wraps hooks so that an exception inside one never reaches the engine."""

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks

    @property
    def wrapped(self) -> Hooks:
        """The hooks this wraps."""
        return self._hooks

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._hooks, name)
        if getattr(type(self._hooks), name, None) is getattr(Hooks, name, None):
            # Not overridden: the base class's no-op cannot raise; call it bare.
            setattr(self, name, target)
            return target

        if name in PIPELINE_HOOKS and not takes_pipeline(target):
            call = _without_pipeline(name, target)
        else:
            def call(*args: Any, **kwargs: Any) -> None:
                try:
                    target(*args, **kwargs)
                except Exception:
                    log.exception("action=hook_failed hook=%s", name)

        setattr(self, name, call)  # made once per hook; later lookups find it directly
        return call


def takes_pipeline(hook: Callable[..., Any]) -> bool:
    """Whether ``hook`` takes the ``pipeline`` keyword (or any keyword); one it cannot
    tell is taken to."""
    try:
        parameters = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(parameter.name == "pipeline" or parameter.kind is parameter.VAR_KEYWORD
               for parameter in parameters)


def _without_pipeline(name: str, target: Callable[..., Any]) -> Callable[..., None]:
    """``target``, an override written before its hook took ``pipeline``, called without
    it; an exception it raises is logged and ignored."""
    def call(*args: Any, pipeline: str = DEFAULT_PIPELINE, **kwargs: Any) -> None:
        try:
            target(*args, **kwargs)
        except Exception:
            log.exception("action=hook_failed hook=%s", name)

    return call
