"""The completion routes' per-address token bucket (processor.api.client_rate), on a
fake clock."""

from __future__ import annotations

import pytest

from processor.api.client_rate import ClientRate, GuessCharge, retry_after
from watcher.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_the_rate_goes_then_one_each_interval() -> None:
    clock = Clock()
    rate = ClientRate(6, clock=clock)  # 6 a minute: one every 10 s
    assert [rate.take("a") for _ in range(6)] == [0.0] * 6
    assert rate.take("a") == pytest.approx(10.0)
    assert rate.take("b") == 0.0, "another address has its own bucket"
    clock.now += 5
    assert rate.take("a") == pytest.approx(5.0), "a refused request spends nothing"
    clock.now += 5
    assert rate.take("a") == 0.0
    assert rate.take("a") > 0
    clock.now += 3600
    assert [rate.take("a") for _ in range(6)] == [0.0] * 6, "the bucket holds one burst"
    assert rate.take("a") > 0


def test_zero_turns_the_bound_off_and_bad_rates_are_refused() -> None:
    rate = ClientRate(0)
    assert all(rate.take("a") == 0.0 for _ in range(1000))
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="--completion-rate"):
            ClientRate(bad)  # type: ignore[arg-type]


def test_forgotten_addresses_start_full_and_the_table_is_bounded() -> None:
    clock = Clock()
    rate = ClientRate(1, clock=clock, max_clients=3)
    for address in ("a", "b", "c", "d"):
        assert rate.take(address) == 0.0
    assert len(rate._buckets) == 3
    assert rate.take("d") > 0


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert [retry_after(s) for s in (0.01, 1.0, 1.2, 59.9)] == ["1", "1", "2", "60"]


def test_asking_whether_a_client_may_go_on_spends_nothing() -> None:
    clock = Clock()
    rate = ClientRate(2, clock=clock)  # 2 refused lookups a minute
    assert all(rate.exhausted("a") == 0.0 for _ in range(100))
    rate.take("a")
    rate.take("a")
    assert rate.exhausted("a") == pytest.approx(30.0)
    assert rate.exhausted("b") == 0.0
    clock.now += 30
    assert rate.exhausted("a") == 0.0


def test_a_token_given_back_returns_to_its_bucket_up_to_its_capacity() -> None:
    clock = Clock()
    rate = ClientRate(2, clock=clock)
    assert [rate.take("a") for _ in range(2)] == [0.0, 0.0]
    assert rate.take("a") > 0
    rate.give_back("a")
    assert rate.take("a") == 0.0 and rate.take("a") > 0
    rate.give_back("b")  # a full bucket stays full
    assert [rate.take("b") for _ in range(3)][-1] > 0


def test_a_request_is_charged_once_at_its_first_miss_and_refunded_if_found() -> None:
    clock = Clock()
    rate = ClientRate(2, clock=clock)
    found = GuessCharge(rate, "a")
    assert found.spend() == 0.0 and found.spend() == 0.0  # a second miss spends nothing more
    guess = GuessCharge(rate, "a")
    assert guess.spend() == 0.0
    assert GuessCharge(rate, "a").spend() > 0, "two lookups in flight hold both tokens"
    found.settle(refused=False)  # its wait turned up: its token comes back
    guess.settle(refused=True)  # its 404 went out: spent already, not again
    late = GuessCharge(rate, "a")
    assert late.spend() == 0.0
    assert GuessCharge(rate, "a").spend() > 0
    unlooked = GuessCharge(rate, "b")
    unlooked.settle(refused=True)  # a 404 without a lookup (a malformed token) counts too
    assert rate.take("b") == 0.0 and rate.take("b") > 0
