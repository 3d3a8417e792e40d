"""The flow-control metrics: limited keys' calls in flight, grants and limits,
calls held back by rate limits and Retry-After blocks, and the paused keys and fleet.

Part of :class:`processor.observe.metrics.PrometheusHooks`, which owns the registry. Keys are
operator data, so they are labels only under a rule (``docs/reference/metrics.md``): a
key has series while this processor holds a grant of it or runs its calls, which
happens only for keys with a limit, and at most :data:`MAX_KEY_SERIES` keys at once.
"""

from __future__ import annotations

import contextlib
import time

from prometheus_client import CollectorRegistry, Counter, Gauge

from watcher.reports import FlowControlInfo

# Flow control. A key is a label only while this processor holds a grant of it or runs
# its calls (so only keys with a limit: the default or an operator's), and for at most
# MAX_KEY_SERIES keys at once; the calls and slots of further keys add up under the
# empty key, which no key can be (a key is a non-empty id).
MAX_KEY_SERIES = 100
OTHER_KEYS = ""
THROTTLE_SCOPES = ("handler", "key")
THROTTLE_REASONS = ("rate", "block")
# The flow-control rows a backlog read counts paused keys in, at most.
FLOW_READ_CAP = 10_000
# Outside its set: a guard on cardinality (the engine names none today).
OTHER = "other"


class FlowMetrics:
    """The flow-control series of one registry: each limited key's calls in flight, slots
    granted and limit at this processor (labelled by key under the cardinality rule of
    :data:`MAX_KEY_SERIES`), calls held back by scope and reason, handler blocks, and
    the paused keys and fleet (from the database, with the backlog)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.key_in_flight = Gauge("statefeed_key_in_flight",
                                   "Calls of a limited key running at this processor (key "
                                   "'': the keys beyond the first 100)", ["key"], registry=r)
        self.key_granted = Gauge("statefeed_key_granted",
                                 "Slots of a limited key's fleet-wide limit this processor "
                                 "holds (key '': the keys beyond the first 100)", ["key"],
                                 registry=r)
        self.key_limit = Gauge("statefeed_key_limit",
                               "A limited key's fleet-wide in-flight limit, as this processor "
                               "last applied it", ["key"], registry=r)
        self.throttled_calls = Counter("statefeed_calls_throttled_total",
                                       "Calls held back by a rate limit (reason rate) or a "
                                       "handler's Retry-After (reason block), of the handler "
                                       "or of a key", ["scope", "reason"], registry=r)
        # A small fixed set: each series is known (0) from the start.
        self._throttled = {(scope, reason): self.throttled_calls.labels(scope, reason)
                           for scope in THROTTLE_SCOPES for reason in THROTTLE_REASONS}
        self.blocks = Counter("statefeed_handler_blocks_total",
                              "Retry-After answers that blocked every call to the handler",
                              registry=r)
        self.blocked_seconds = Gauge("statefeed_handler_blocked_seconds",
                                     "Seconds left of the handler's latest Retry-After block "
                                     "(0: not blocked)", registry=r)
        self.blocked_seconds.set_function(self.seconds_left)
        self._blocked_until = 0.0  # time.monotonic()
        self.keys_paused = Gauge("statefeed_keys_paused",
                                 "Keys paused by an operator (read from the database with "
                                 f"the backlog; counts the first {FLOW_READ_CAP:,} flow "
                                 "controls)", registry=None)
        self.fleet_paused = Gauge("statefeed_fleet_paused",
                                  "1 while everything is paused (processor pause --all)",
                                  registry=None)
        self._registry = registry
        self._controls_known = False
        # key -> (in flight, granted) of the keys summed under OTHER_KEYS
        self._others: dict[str, tuple[int, int]] = {}
        self._labelled: set[str] = set()

    def seconds_left(self) -> float:
        """Seconds until the handler's block ends, 0 when none holds (read at scrape)."""
        return max(0.0, self._blocked_until - time.monotonic())

    def blocked(self, seconds: float) -> None:
        self.blocks.inc()
        self._blocked_until = max(self._blocked_until, time.monotonic() + max(0.0, seconds))

    def throttled(self, scope: str, reason: str, count: int) -> None:
        series = self._throttled.get((scope, reason))
        if series is None:  # not a scope or reason of the engine's: a cardinality guard
            series = self._throttled[(scope, reason)] = self.throttled_calls.labels(
                scope if scope in THROTTLE_SCOPES else OTHER,
                reason if reason in THROTTLE_REASONS else OTHER)
        series.inc(count)

    def key_grant(self, key: str, in_flight: int, granted: int, limit: int) -> None:
        idle = in_flight == 0 and granted == 0
        if key in self._labelled:
            if idle:  # the key left this processor: its series go, making room
                self._labelled.discard(key)
                for gauge in (self.key_in_flight, self.key_granted, self.key_limit):
                    gauge.remove(key)
                return
        elif not idle and key not in self._others and len(self._labelled) < MAX_KEY_SERIES:
            self._labelled.add(key)
        else:  # summed under OTHER_KEYS (or idle and not shown)
            if idle:
                self._others.pop(key, None)
            else:
                self._others[key] = (in_flight, granted)
            self._set_others()
            return
        self.key_in_flight.labels(key).set(in_flight)
        self.key_granted.labels(key).set(granted)
        self.key_limit.labels(key).set(limit)

    def _set_others(self) -> None:
        if not self._others:
            for gauge in (self.key_in_flight, self.key_granted):
                with contextlib.suppress(KeyError):
                    gauge.remove(OTHER_KEYS)
            return
        self.key_in_flight.labels(OTHER_KEYS).set(sum(c for c, _ in self._others.values()))
        self.key_granted.labels(OTHER_KEYS).set(sum(g for _, g in self._others.values()))

    def controls(self, rows: list[FlowControlInfo]) -> None:
        """Count the paused keys and the fleet's pause in ``rows``; the two gauges
        appear at the first read."""
        self.keys_paused.set(sum(1 for row in rows
                                 if row.scope == "key" and row.paused_at is not None))
        self.fleet_paused.set(any(row.scope == "fleet" and row.paused_at is not None
                                  for row in rows))
        if not self._controls_known:
            self._controls_known = True
            self._registry.register(self.keys_paused)
            self._registry.register(self.fleet_paused)
