"""Hooks: a failing hook never reaches the engine; the Prometheus hooks count outcomes."""

from __future__ import annotations

import logging
import platform
from importlib import metadata
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from processor.notify.metrics import NotifyMetrics
from processor.observe.metrics import PrometheusHooks
from processor.observe.metrics_pipelines import MAX_PIPELINE_LABELS
from watcher.hooks import Hooks, SafeHooks
from watcher.models import MAX_GATE
from watcher.reports import Backlog, PlaceCount

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "metrics.md"


class Failing(Hooks):
    def item_outcome(self, partition_id, item_id, gate, outcome, seconds) -> None:
        raise RuntimeError("metrics backend down")


def test_a_hook_that_raises_is_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    hooks = SafeHooks(Failing())
    with caplog.at_level(logging.ERROR, logger="watcher.hooks"):
        hooks.item_outcome("p", "i", 0, "complete", 0.1)
        hooks.item_outcome("p", "i", 0, "complete", 0.1)
    assert [r.getMessage() for r in caplog.records] == [
        "action=hook_failed hook=item_outcome"] * 2
    hooks.item_dispatched("p", "i", 0)  # not overridden: the base no-op, called bare
    assert hooks.item_dispatched == Hooks.item_dispatched.__get__(hooks._hooks)


def samples(hooks: PrometheusHooks) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The scrape parsed by prometheus_client: sample name -> sorted labels -> value."""
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(hooks.render().decode()):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = (
                sample.value)
    return found


def test_prometheus_hooks_count_each_outcome_apart() -> None:
    hooks = PrometheusHooks()
    for outcome in ("complete", "complete", "retry", "complete"):
        hooks.item_outcome("p", "i", 0, outcome, 0.002)
    hooks.item_outcome("p", "i", 1, "advanced", 0.2)
    hooks.item_outcome("q", "i", 0, "complete", 0.002, pipeline="invoices")
    text = hooks.render().decode()
    assert 'statefeed_items_total{outcome="complete",pipeline="default"} 3.0' in text
    assert 'statefeed_items_total{outcome="retry",pipeline="default"} 1.0' in text
    assert 'statefeed_items_total{outcome="complete",pipeline="invoices"} 1.0' in text
    assert ('statefeed_handler_seconds_count{gate="0",outcome="complete",pipeline="default"} '
            '3.0') in text
    assert ('statefeed_handler_seconds_count{gate="0",outcome="retry",pipeline="default"} '
            '1.0') in text
    assert ('statefeed_handler_seconds_bucket{gate="1",le="0.1",outcome="advanced",'
            'pipeline="default"} 0.0') in text
    assert ('statefeed_handler_seconds_bucket{gate="1",le="0.25",outcome="advanced",'
            'pipeline="default"} 1.0') in text


def test_latency_labels_stay_within_the_cardinality_rule() -> None:
    """Gates from 16 on share "16+", an outcome the engine does not name is "other", and
    neither the partition nor the item id is a label, however many there are."""
    hooks = PrometheusHooks()
    for gate in (*range(20), 1000, MAX_GATE):
        for outcome in ("complete", "failed", "something-new"):
            hooks.item_outcome(f"p{gate}", f"item-{gate}", gate, outcome, 0.01)
    counts = samples(hooks)["statefeed_handler_seconds_count"]
    gates = {dict(labels)["gate"] for labels in counts}
    assert gates == {str(gate) for gate in range(16)} | {"16+"}
    assert {dict(labels)["outcome"] for labels in counts} == {"complete", "failed", "other"}
    assert counts[(("gate", "16+"), ("outcome", "complete"),
                   ("pipeline", "default"))] == 4 + 2  # 16-19, 1000, max
    assert len(counts) == 17 * 3
    for values in samples(hooks).values():
        for labels in values:
            assert not {"partition", "partition_id", "item", "item_id"} & dict(labels).keys()
    assert "item-" not in hooks.render().decode()


def test_reduce_calls_are_labelled_pass_and_outcome() -> None:
    hooks = PrometheusHooks()
    hooks.reduce_outcome("p", 1, "fold", "applied", 0.01, pipeline="ranks")
    hooks.reduce_outcome("p", 1, "fold", "applied", 0.01, pipeline="ranks")
    hooks.reduce_outcome("p", 1, "apply", "retry", 0.3)
    found = samples(hooks)
    assert found["statefeed_reduce_calls_total"] == {
        (("outcome", "applied"), ("pass", "fold"), ("pipeline", "ranks")): 2.0,
        (("outcome", "retry"), ("pass", "apply"), ("pipeline", "default")): 1.0}
    assert found["statefeed_reduce_seconds_count"] == {
        (("pass", "fold"), ("pipeline", "ranks")): 2.0,
        (("pass", "apply"), ("pipeline", "default")): 1.0}
    assert "pass_" not in hooks.render().decode()


def test_a_fresh_registry_shows_only_what_is_known() -> None:
    """Before anything happened: the build info, and the unlabelled counts and gauges
    that are truly zero; no outcome, lease event or close series, and no backlog gauge
    until the database has been read."""
    hooks = PrometheusHooks()
    found = samples(hooks)
    ((labels, value),) = found["statefeed_build_info"].items()
    assert value == 1.0 and dict(labels) == {"version": metadata.version("statefeed"),
                                             "python": platform.python_version()}
    for unknown in ("statefeed_items_total", "statefeed_handler_seconds_count",
                    "statefeed_lease_events_total", "statefeed_partitions_closed_total",
                    "statefeed_reduce_calls_total", "statefeed_partitions",
                    "statefeed_items_waiting", "statefeed_oldest_waiting_item_seconds"):
        assert unknown not in found, unknown
    assert found["statefeed_in_flight"] == {(): 0.0}
    assert found["statefeed_leases_held"] == {(): 0.0}
    hooks.backlog(Backlog({"available": 2, "complete": 0}, items_waiting=7,
                          oldest_waiting=12.5))
    found = samples(hooks)
    assert found["statefeed_partitions"] == {(("status", "available"),): 2.0,
                                             (("status", "complete"),): 0.0}
    assert found["statefeed_items_waiting"] == {(): 7.0}
    assert found["statefeed_oldest_waiting_item_seconds"] == {(): 12.5}
    hooks.backlog(Backlog({"available": 0, "complete": 2}, items_waiting=0))
    assert samples(hooks)["statefeed_oldest_waiting_item_seconds"] == {(): 0.0}



def test_every_metric_is_documented_with_its_labels() -> None:
    """docs/reference/metrics.md has a row per exported metric, naming its labels."""
    rows = {line.split("|")[1].strip(" `"): line.split("|")[3]
            for line in METRICS_DOC.read_text().splitlines()
            if line.startswith("| `statefeed_")}
    hooks = PrometheusHooks()  # every hook once, so that every labelled series exists
    hooks.backlog(Backlog({"available": 1}, items_waiting=1))
    hooks.item_outcome("p", "i", 0, "complete", 0.1)
    hooks.reduce_outcome("p", 1, "all", "applied", 0.1)
    hooks.lease_acquired("p", stolen_from=None)
    hooks.partition_closed("p", "complete")
    hooks.gate_advanced("p", 0, 1)
    hooks.places(([PlaceCount("ocr", None, 0, 2)], [PlaceCount("ocr", None, 0, 2)]))
    hooks.key_grant("acme", 1, 2, 4)
    hooks.flow_controls([])
    # The notifications' delivery loop registers its own on the same registry.
    notify = NotifyMetrics(hooks.registry)
    notify.counts({"pending": 1, "due": 0, "dead": 0})
    notify.attempted("delivered")
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(hooks.render().decode()):
        name = f"{family.name}_total" if family.type == "counter" else family.name
        if family.type == "gauge" and family.name.endswith("_created"):
            continue  # prometheus-client's creation times of counters and histograms
        if not family.name.startswith("statefeed_"):
            continue  # the process's and Python's own (the next test)
        labels[name] = {label for sample in family.samples for label in sample.labels
                        if label != "le"}
    assert set(rows) == set(labels)
    for name, names in labels.items():
        assert all(f"`{label}`" in rows[name] for label in names), (name, names, rows[name])


def test_the_scrape_has_the_process_and_python_metrics() -> None:
    """process_* (CPU, memory, files, start time) and python_info, as the
    prometheus-client's collectors give them, documented beside statefeed's."""
    found = samples(PrometheusHooks())
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                 "process_open_fds", "process_start_time_seconds"):
        assert name in found, name
        assert name.removesuffix("_total") in METRICS_DOC.read_text()
    assert found["process_resident_memory_bytes"][()] > 0
    assert ("implementation", "CPython") in next(iter(found["python_info"]))


class Older(Hooks):
    """Hooks written before the progress hooks took ``pipeline``."""

    def __init__(self) -> None:
        self.seen: list[tuple[object, ...]] = []

    def item_outcome(self, partition_id, item_id, gate, outcome, seconds) -> None:
        self.seen.append((partition_id, outcome))

    def partition_closed(self, partition_id: str, status: str) -> None:
        self.seen.append((partition_id, status))

    def gate_advanced(self, partition_id, from_gate, to_gate, **more) -> None:
        self.seen.append((partition_id, to_gate, more))


def test_an_override_without_pipeline_is_still_called_without_it(
        caplog: pytest.LogCaptureFixture) -> None:
    older = Older()
    hooks = SafeHooks(older)
    with caplog.at_level(logging.ERROR, logger="watcher.hooks"):
        hooks.item_outcome("p", "i", 0, "complete", 0.1, pipeline="invoices")
        hooks.partition_closed("p", "complete", pipeline="invoices")
        hooks.gate_advanced("p", 0, 1, pipeline="invoices")  # **kwargs: given it
    assert older.seen == [("p", "complete"), ("p", "complete"),
                          ("p", 1, {"pipeline": "invoices"})]
    assert caplog.records == []


def test_pipelines_past_the_first_twenty_share_one_label() -> None:
    hooks = PrometheusHooks()
    for n in range(MAX_PIPELINE_LABELS + 5):
        hooks.partition_closed(f"p{n}", "complete", pipeline=f"pipe{n}")
    hooks.partition_closed("again", "complete", pipeline="pipe0")  # keeps its own label
    closed = samples(hooks)["statefeed_partitions_closed_total"]
    assert len(closed) == MAX_PIPELINE_LABELS + 1
    assert closed[(("pipeline", "other"), ("status", "complete"))] == 5
    assert closed[(("pipeline", "pipe0"), ("status", "complete"))] == 2


def test_the_unserved_gauge_has_a_series_per_pipeline_with_open_partitions() -> None:
    hooks = PrometheusHooks()
    assert "statefeed_partitions_unserved" not in samples(hooks)  # unknown before a read
    ocr, ranks = PlaceCount("ocr", None, 0, 3), PlaceCount("ranks", "v2", 1, 2)
    hooks.places(([ocr, ranks, PlaceCount("ocr", None, 1, 4)], [ocr, ranks]))
    assert samples(hooks)["statefeed_partitions_unserved"] == {
        (("pipeline", "ocr"),): 3.0, (("pipeline", "ranks"),): 2.0}
    hooks.places(([PlaceCount("ocr", None, 1, 4)], []))  # ranks has no open partition left
    assert samples(hooks)["statefeed_partitions_unserved"] == {(("pipeline", "ocr"),): 0.0}
    hooks.places(([], []))
    assert "statefeed_partitions_unserved" not in samples(hooks)
