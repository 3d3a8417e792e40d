"""Hooks: a failing hook never reaches the engine; the Prometheus hooks count outcomes."""

from __future__ import annotations

import logging

import pytest

from processor.metrics import PrometheusHooks
from watcher.hooks import Hooks, SafeHooks


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


def test_prometheus_hooks_count_each_outcome_apart() -> None:
    hooks = PrometheusHooks()
    for outcome in ("complete", "complete", "retry", "complete"):
        hooks.item_outcome("p", "i", 0, outcome, 0.002)
    text = hooks.render().decode()
    assert 'statefeed_items_total{outcome="complete"} 3.0' in text
    assert 'statefeed_items_total{outcome="retry"} 1.0' in text
    assert "statefeed_handler_seconds_count 4.0" in text
