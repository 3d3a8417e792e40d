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
from watcher.hooks import Hooks, SafeHooks
from watcher.models import MAX_GATE
from watcher.reports import Backlog

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
    text = hooks.render().decode()
    assert 'statefeed_items_total{outcome="complete"} 3.0' in text
    assert 'statefeed_items_total{outcome="retry"} 1.0' in text
    assert 'statefeed_handler_seconds_count{gate="0",outcome="complete"} 3.0' in text
    assert 'statefeed_handler_seconds_count{gate="0",outcome="retry"} 1.0' in text
    assert 'statefeed_handler_seconds_bucket{gate="1",le="0.1",outcome="advanced"} 0.0' in text
    assert 'statefeed_handler_seconds_bucket{gate="1",le="0.25",outcome="advanced"} 1.0' in text


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
    assert counts[(("gate", "16+"), ("outcome", "complete"))] == 4 + 2  # 16-19, 1000, max
    assert len(counts) == 17 * 3
    for values in samples(hooks).values():
        for labels in values:
            assert not {"partition", "partition_id", "item", "item_id"} & dict(labels).keys()
    assert "item-" not in hooks.render().decode()


def test_reduce_calls_are_labelled_pass_and_outcome() -> None:
    hooks = PrometheusHooks()
    hooks.reduce_outcome("p", 1, "fold", "applied", 0.01)
    hooks.reduce_outcome("p", 1, "fold", "applied", 0.01)
    hooks.reduce_outcome("p", 1, "apply", "retry", 0.3)
    found = samples(hooks)
    assert found["statefeed_reduce_calls_total"] == {
        (("outcome", "applied"), ("pass", "fold")): 2.0,
        (("outcome", "retry"), ("pass", "apply")): 1.0}
    assert found["statefeed_reduce_seconds_count"] == {(("pass", "fold"),): 2.0,
                                                       (("pass", "apply"),): 1.0}
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
        labels[name] = {label for sample in family.samples for label in sample.labels
                        if label != "le"}
    assert set(rows) == set(labels)
    for name, names in labels.items():
        assert all(f"`{label}`" in rows[name] for label in names), (name, names, rows[name])
