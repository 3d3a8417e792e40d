"""The flow-control metrics: key series under the cardinality rule, throttled calls by
scope and reason, handler blocks, and the paused keys read with the backlog."""

from __future__ import annotations

from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families

from processor.observe.metrics import PrometheusHooks
from processor.observe.metrics_flow import MAX_KEY_SERIES, OTHER_KEYS
from watcher.reports import FlowControlInfo


def samples(hooks: PrometheusHooks) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    found: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(hooks.render().decode()):
        for sample in family.samples:
            found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return found


def key(name: str) -> frozenset[tuple[str, str]]:
    return frozenset({("key", name)})


def test_a_key_has_series_while_it_is_granted_or_running_here() -> None:
    hooks = PrometheusHooks()
    assert "statefeed_key_in_flight" not in samples(hooks)
    hooks.key_grant("acme", 3, 4, 10)
    seen = samples(hooks)
    assert seen["statefeed_key_in_flight"] == {key("acme"): 3.0}
    assert seen["statefeed_key_granted"] == {key("acme"): 4.0}
    assert seen["statefeed_key_limit"] == {key("acme"): 10.0}
    hooks.key_grant("acme", 0, 0, 10)  # the key left this processor: its series go
    seen = samples(hooks)
    assert "statefeed_key_in_flight" not in seen and "statefeed_key_limit" not in seen


def test_keys_beyond_the_cap_add_up_under_the_empty_key() -> None:
    hooks = PrometheusHooks()
    for n in range(MAX_KEY_SERIES + 3):
        hooks.key_grant(f"k{n}", 1, 2, 5)
    in_flight = samples(hooks)["statefeed_key_in_flight"]
    assert len(in_flight) == MAX_KEY_SERIES + 1
    assert in_flight[key(OTHER_KEYS)] == 3.0
    assert samples(hooks)["statefeed_key_granted"][key(OTHER_KEYS)] == 6.0
    hooks.key_grant(f"k{MAX_KEY_SERIES + 1}", 0, 0, 5)
    assert samples(hooks)["statefeed_key_in_flight"][key(OTHER_KEYS)] == 2.0
    hooks.key_grant("k0", 0, 0, 5)  # a labelled key leaves: room for a new one
    hooks.key_grant("fresh", 1, 1, 5)
    assert key("fresh") in samples(hooks)["statefeed_key_in_flight"]


def test_throttled_calls_by_scope_and_reason_and_handler_blocks() -> None:
    hooks = PrometheusHooks()
    throttled = samples(hooks)["statefeed_calls_throttled_total"]
    assert set(throttled.values()) == {0.0} and len(throttled) == 4  # known from the start
    hooks.calls_throttled("handler", "rate", 5)
    hooks.calls_throttled("key", "block", 2)
    hooks.calls_throttled("tenant", "odd", 1)  # not the engine's: one guarded value
    throttled = samples(hooks)["statefeed_calls_throttled_total"]
    assert throttled[frozenset({("scope", "handler"), ("reason", "rate")})] == 5.0
    assert throttled[frozenset({("scope", "key"), ("reason", "block")})] == 2.0
    assert throttled[frozenset({("scope", "other"), ("reason", "other")})] == 1.0
    assert samples(hooks)["statefeed_handler_blocked_seconds"][frozenset()] == 0.0
    blocked = 30.0
    hooks.handler_blocked(blocked)
    seen = samples(hooks)
    assert seen["statefeed_handler_blocks_total"][frozenset()] == 1.0
    # The seconds still blocked: the hold, less the moments since (a loaded machine may
    # take a while between two lines; a quarter of the hold is its margin).
    assert blocked * 0.75 < seen["statefeed_handler_blocked_seconds"][frozenset()] <= blocked


def test_paused_keys_and_the_fleet_pause_appear_at_the_first_read() -> None:
    hooks = PrometheusHooks()
    assert "statefeed_keys_paused" not in samples(hooks)
    at = datetime(2026, 1, 1)
    hooks.flow_controls([FlowControlInfo("key", "a", 4, None, at, None),
                         FlowControlInfo("key", "b", None, None, None, None),
                         FlowControlInfo("key", "c", None, None, at, None),
                         FlowControlInfo("handler", "http://h/", None, 5.0, at, None)])
    seen = samples(hooks)
    assert seen["statefeed_keys_paused"][frozenset()] == 2.0
    assert seen["statefeed_fleet_paused"][frozenset()] == 0.0
    hooks.flow_controls([FlowControlInfo("fleet", "", None, None, at, None)])
    seen = samples(hooks)
    assert (seen["statefeed_keys_paused"][frozenset()],
            seen["statefeed_fleet_paused"][frozenset()]) == (0.0, 1.0)
