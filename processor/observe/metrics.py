"""Prometheus metrics: an implementation of the engine's hooks, and the backlog gauges.

Each :class:`PrometheusHooks` owns its registry, so several watchers in one
process (tests, the demo) never collide on metric names. The backlog gauges
(partitions per status, items waiting at their partition's gate, the age of the
oldest one ready, the open partitions no live processor serves) come from the
database: :class:`BacklogGauges` reads them at
most every few seconds, and only while ``/metrics`` is being scraped, never on
the scrape itself.

A series appears once its value is known: a labelled series when it is first
counted, the backlog gauges after their first successful read. Labels come from
small fixed sets (the cardinality rule in ``docs/reference/metrics.md``): gates
from :data:`GATE_LABELS` on, and every outcome or pass the engine does not
name, share one value; pipelines past the first few share one
(:mod:`processor.observe.metrics_pipelines`); no partition or item id is ever a label.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import time
from collections.abc import Awaitable, Callable
from importlib import metadata

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from sqlalchemy.exc import SQLAlchemyError

from processor.observe.metrics_flow import FlowMetrics
from processor.observe.metrics_pipelines import PipelineLabels, Places, UnservedGauge
from watcher.hooks import Hooks
from watcher.outages import OutageLatch
from watcher.records import DEFAULT_PIPELINE
from watcher.reports import Backlog, FlowControlInfo, PurgeReport

log = logging.getLogger(__name__)

# How often the backlog gauges are read from the database at most, and where each
# count stops (the gauge then reads the cap: enough to scale on, and a bounded read).
DEFAULT_BACKLOG_INTERVAL = 5.0
# How long a scrape waits for a read of gauges gone stale (BacklogGauges.fresh).
FRESH_WAIT = 2.0
BACKLOG_CAP = 1_000_000

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                   60)

# Gates 0 to 15 are labelled by number; every later gate shares the label "16+".
GATE_LABELS = 16
ITEM_OUTCOMES = frozenset({"complete", "advanced", "looped", "snoozed", "retry", "throttled",
                           "held", "failed", "stale"})
REDUCE_PASSES = frozenset({"all", "fold", "apply"})
REDUCE_OUTCOMES = frozenset({"applied", "retry", "held", "failed", "stale"})
# The label of an outcome or pass outside its set (none today: a guard on cardinality).
OTHER = "other"


def gate_label(gate: int) -> str:
    """The ``gate`` label of a gate: its number below :data:`GATE_LABELS`, else ``"16+"``."""
    return str(gate) if gate < GATE_LABELS else f"{GATE_LABELS}+"


def known(value: str, names: frozenset[str]) -> str:
    """``value`` when it is one of ``names``, else :data:`OTHER`."""
    return value if value in names else OTHER


def build_labels() -> dict[str, str]:
    """The ``statefeed_build_info`` labels: statefeed's version and Python's."""
    try:
        version = metadata.version("statefeed")
    except metadata.PackageNotFoundError:  # run from a source tree never installed
        version = "unknown"
    return {"version": version, "python": platform.python_version()}


class PrometheusHooks(Hooks):
    """Counts items by outcome, handler latency by gate and outcome, calls in flight,
    leases, gates, reduces and closes; holds the backlog gauges and the build info."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # The process's own: CPU seconds, resident memory, open files, start time
        # (process_*, read from /proc where there is one), and Python's (python_info).
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        Info("statefeed_build", "statefeed's version and Python's (always 1)",
             registry=r).info(build_labels())
        self.items = Counter("statefeed_items_total", "Item attempts by outcome and pipeline",
                             ["outcome", "pipeline"], registry=r)
        self.latency = Histogram("statefeed_handler_seconds",
                                 "Time from dispatch to result, per item attempt, by gate "
                                 "(16+ for gates from 16 on), outcome and pipeline",
                                 ["gate", "outcome", "pipeline"], buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.in_flight_calls = Gauge("statefeed_in_flight",
                                     "Handler calls running: items (alone or in a batch "
                                     "request) and reduce calls", registry=r)
        self.leases = Gauge("statefeed_leases_held", "Partitions leased by this processor",
                            registry=r)
        self.lease_events = Counter("statefeed_lease_events_total",
                                    "Lease acquisitions, steals, releases and losses",
                                    ["event"], registry=r)
        self.conflicts = Counter("statefeed_lease_conflicts_total",
                                 "Guarded writes that lost a race", registry=r)
        self.stale = Counter("statefeed_stale_results_total",
                             "Results not written because the item or lease moved on, "
                             "by pipeline", ["pipeline"], registry=r)
        self.gates = Counter("statefeed_gate_advances_total", "Gate advances, by pipeline",
                             ["pipeline"], registry=r)
        self.spawned = Counter("statefeed_items_spawned_total",
                               "Items inserted by steps' answers (spawn), by pipeline",
                               ["pipeline"], registry=r)
        # The default pipeline's series exist at 0 from the start, as they did unlabelled.
        self.stale.labels(DEFAULT_PIPELINE)
        self.spawned.labels(DEFAULT_PIPELINE)
        self.closed = Counter("statefeed_partitions_closed_total",
                              "Partitions closed, by status and pipeline",
                              ["status", "pipeline"], registry=r)
        self.reduces = Counter("statefeed_reduce_calls_total",
                               "Reduce calls by pass (all, fold, apply), outcome (applied, "
                               "retry, failed, stale) and pipeline",
                               ["pass", "outcome", "pipeline"], registry=r)
        self.reduce_latency = Histogram("statefeed_reduce_seconds",
                                        "Time from reduce call to its write, per call, by "
                                        "pass and pipeline", ["pass", "pipeline"],
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.purged_partitions = Counter("statefeed_purged_partitions_total",
                                         "Partitions deleted by background retention",
                                         registry=r)
        self.purged_items = Counter("statefeed_purged_items_total",
                                    "Items deleted by background retention (with their "
                                    "partitions, or finished items of open ones)", registry=r)
        # Registered at the first read of the backlog: until then their values are unknown.
        self.partitions = Gauge("statefeed_partitions",
                                "Partitions by status (read from the database every few "
                                "seconds; each count stops at 1,000,000)", ["status"],
                                registry=None)
        self.items_waiting = Gauge("statefeed_items_waiting",
                                   "Available items at their open partition's current gate "
                                   "(read from the database every few seconds; stops at "
                                   "1,000,000)", registry=None)
        self.oldest_waiting = Gauge("statefeed_oldest_waiting_item_seconds",
                                    "How long the oldest item ready at its open partition's "
                                    "current gate has waited, by the database clock (0 when "
                                    "none is ready; read every few seconds)", registry=None)
        self.items_parked = Gauge("statefeed_items_parked",
                                  "Items parked (status waiting) in open partitions until a "
                                  "completion (read every few seconds; stops at 1,000,000)",
                                  registry=None)
        self.oldest_parked = Gauge("statefeed_oldest_parked_item_seconds",
                                   "How long the longest-parked item has waited for its "
                                   "completion, by the database clock (0 when none is "
                                   "parked; read every few seconds)", registry=None)
        self._backlog_known = False
        self.pipeline_label = PipelineLabels()
        self.unserved = UnservedGauge(r, self.pipeline_label)
        self.flow = FlowMetrics(r)
        # labels() takes a lock and builds a key: made once per label set, then looked up.
        self._item_series: dict[tuple[str, int, str], tuple[Counter, Histogram]] = {}
        self._reduce_series: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}
        self._gate_series: dict[str, Counter] = {}
        self.scraped_at = 0.0  # time.monotonic() of the last render, 0.0 before any

    def render(self) -> bytes:
        """The metrics in Prometheus text format."""
        self.scraped_at = time.monotonic()
        return generate_latest(self.registry)

    def backlog(self, backlog: Backlog) -> None:
        """Set the backlog gauges from a read of the database (they appear at the first)."""
        for status, count in backlog.partitions.items():
            self.partitions.labels(status).set(count)
        self.items_waiting.set(backlog.items_waiting)
        self.oldest_waiting.set(backlog.oldest_waiting)
        self.items_parked.set(backlog.items_parked)
        self.oldest_parked.set(backlog.oldest_parked)
        if not self._backlog_known:
            self._backlog_known = True
            for gauge in (self.partitions, self.items_waiting, self.oldest_waiting,
                          self.items_parked, self.oldest_parked):
                self.registry.register(gauge)

    def places(self, places: Places) -> None:
        """Set the unserved gauge from a read of the open partitions' places and those no
        live processor serves (it appears at the first)."""
        self.unserved.set(*places)

    def flow_controls(self, rows: list[FlowControlInfo]) -> None:
        """Set the pause gauges from a read of the flow-control rows."""
        self.flow.controls(rows)

    def key_grant(self, key: str, in_flight: int, granted: int, limit: int) -> None:
        self.flow.key_grant(key, in_flight, granted, limit)

    def calls_throttled(self, scope: str, reason: str, count: int) -> None:
        self.flow.throttled(scope, reason, count)

    def handler_blocked(self, seconds: float) -> None:
        self.flow.blocked(seconds)

    def retention_purged(self, report: PurgeReport) -> None:
        """Count what a background retention pass removed."""
        self.purged_partitions.inc(report.partitions)
        self.purged_items.inc(report.items + report.finished_items)

    def lease_acquired(self, partition_id: str, *, stolen_from: str | None) -> None:
        self.lease_events.labels("stolen" if stolen_from else "acquired").inc()

    def lease_released(self, partition_id: str) -> None:
        self.lease_events.labels("released").inc()

    def lease_lost(self, partition_id: str) -> None:
        self.lease_events.labels("lost").inc()

    def lease_handed_over(self, partition_id: str) -> None:
        self.lease_events.labels("handed_over").inc()

    def lease_conflict(self, partition_id: str) -> None:
        self.conflicts.inc()

    def item_outcome(self, partition_id: str, item_id: str, gate: int, outcome: str,
                     seconds: float, *, pipeline: str = DEFAULT_PIPELINE) -> None:
        key = (pipeline, gate if gate < GATE_LABELS else GATE_LABELS, outcome)
        series = self._item_series.get(key)
        if series is None:
            label, named = known(outcome, ITEM_OUTCOMES), self.pipeline_label(pipeline)
            series = self._item_series[key] = (
                self.items.labels(label, named),
                self.latency.labels(gate_label(gate), label, named))
        counter, histogram = series
        counter.inc()
        histogram.observe(seconds)

    def stale_result(self, partition_id: str, item_id: str, *,
                     pipeline: str = DEFAULT_PIPELINE) -> None:
        self.stale.labels(self.pipeline_label(pipeline)).inc()

    def gate_advanced(self, partition_id: str, from_gate: int, to_gate: int, *,
                      pipeline: str = DEFAULT_PIPELINE) -> None:
        series = self._gate_series.get(pipeline)
        if series is None:
            series = self._gate_series[pipeline] = self.gates.labels(
                self.pipeline_label(pipeline))
        series.inc()

    def items_spawned(self, partition_id: str, count: int, *,
                      pipeline: str = DEFAULT_PIPELINE) -> None:
        self.spawned.labels(self.pipeline_label(pipeline)).inc(count)

    def partition_closed(self, partition_id: str, status: str, *,
                         pipeline: str = DEFAULT_PIPELINE) -> None:
        self.closed.labels(status, self.pipeline_label(pipeline)).inc()

    def reduce_outcome(self, partition_id: str, gate: int, pass_: str, outcome: str,
                       seconds: float, *, pipeline: str = DEFAULT_PIPELINE) -> None:
        key = (pipeline, pass_, outcome)
        series = self._reduce_series.get(key)
        if series is None:
            label, named = known(pass_, REDUCE_PASSES), self.pipeline_label(pipeline)
            series = self._reduce_series[key] = (
                self.reduces.labels(label, known(outcome, REDUCE_OUTCOMES), named),
                self.reduce_latency.labels(label, named))
        counter, histogram = series
        counter.inc()
        histogram.observe(seconds)

    def leases_held(self, count: int) -> None:
        self.leases.set(count)

    def in_flight(self, count: int) -> None:
        self.in_flight_calls.set(count)


class BacklogGauges:
    """Keeps the backlog gauges of ``hooks`` fresh: one bounded read (``read``) at start,
    then at most one per ``interval`` seconds, only after a scrape asked for the metrics.

    So the database is asked at most once per interval per processor however
    often ``/metrics`` is scraped, and not at all while nobody scrapes.
    """

    def __init__(self, hooks: PrometheusHooks, read: Callable[[], Awaitable[Backlog]], *,
                 interval: float = DEFAULT_BACKLOG_INTERVAL,
                 read_flow: Callable[[], Awaitable[list[FlowControlInfo]]] | None = None,
                 read_places: Callable[[], Awaitable[Places]] | None = None) -> None:
        self.hooks = hooks
        self.read = read
        self.read_flow = read_flow
        self.read_places = read_places
        self.interval = interval
        self.refreshed_at = 0.0
        self._stop = asyncio.Event()
        self._outage = OutageLatch()
        self._reading: asyncio.Future[bool] | None = None

    async def run_once(self) -> bool:
        """Read the backlog and set the gauges. Returns ``False`` when the read failed
        (the gauges keep their last values, or stay absent before the first read that
        succeeded; the failure is logged once). Never raises a database error."""
        try:
            backlog = await self.read()
            controls = None if self.read_flow is None else await self.read_flow()
            places = None if self.read_places is None else await self.read_places()
        except SQLAlchemyError as error:
            if self._outage.fail():
                log.warning("action=backlog_read_failed error=%s; the gauges keep their last "
                            "values", type(error).__name__)
            return False
        self._outage.recover()
        self.refreshed_at = time.monotonic()
        self.hooks.backlog(backlog)
        if controls is not None:
            self.hooks.flow_controls(controls)
        if places is not None:
            self.hooks.places(places)
        return True

    async def fresh(self) -> None:
        """Before a scrape: gauges last read more than an interval ago (nobody scraped
        for a while) are read now, so the scrape does not answer the values of before
        the quiet spell. Waits at most :data:`FRESH_WAIT` seconds: a slower read
        finishes by itself, and this scrape shows the last values."""
        if time.monotonic() - self.refreshed_at < self.interval:
            return
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self.run_once())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reading), FRESH_WAIT)

    async def run(self) -> None:
        """Refresh once, then every interval in which a scrape happened, until :meth:`stop`."""
        await self.run_once()
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)
            if not self._stop.is_set() and self.hooks.scraped_at > self.refreshed_at:
                await self.run_once()

    def stop(self) -> None:
        """Ask :meth:`run` to end. Safe to call twice."""
        self._stop.set()
