"""Fleet-wide rate limits and Retry-After holds, across `processor run` processes on
PostgreSQL, measured at a real handler: three processors at `--rate-limit 50` together
make 50 calls a second (within 10 % over 20 s), and a 429 with `Retry-After: 3` stops
every processor's calls to the handler for three seconds, with no item losing an
attempt; a routing processor started during a service's hold makes no call to it
before the hold ends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from processor import NewItem
from tests.acceptance.harness.cluster import Cluster
from tests.support.engine import wait_until
from tests.support.servers import read_body, send_json

WINDOW = 20.0
RATE = 50.0


class Arrivals:
    """A handler that completes every item and notes when each call arrives; it answers
    429 with ``Retry-After`` to the call numbered ``throttle_at`` (from 1), once."""

    def __init__(self, *, throttle_at: int | None = None, retry_after: int = 3) -> None:
        self.at: list[float] = []
        self.throttle_at = throttle_at
        self.retry_after = retry_after
        self.throttled: float | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        if scope["method"] == "GET":  # the readiness probe of the handler's health
            await send_json(send, 200, {})
            return
        self.at.append(time.monotonic())
        if len(self.at) == self.throttle_at:
            self.throttled = time.monotonic()
            await send_json(send, 429, {"error": {"message": "slow down"}},
                            headers=[("retry-after", str(self.retry_after))])
            return
        await send_json(send, 200, {"done": True})


async def test_three_processors_keep_to_one_rate_at_the_handler(tmp_path: Path) -> None:
    handler = Arrivals()
    async with Cluster(tmp_path, handler, name="rate") as cluster:
        for n in range(6):
            await cluster.client.create_partition(
                f"p{n}", [NewItem(f"i{m}", b"{}") for m in range(300)])
        url = f"{cluster.base_url}/"
        for _ in range(3):
            await cluster.start(None, "--rate-limit", str(RATE), handler_url=url)
        await wait_until(lambda: len(handler.at) >= 1, timeout=30, message="a first call")
        start = handler.at[0] + 2.0  # past the start-up and the first burst
        end = start + WINDOW
        await wait_until(lambda: handler.at[-1] >= end, timeout=WINDOW + 30,
                         message=f"{WINDOW} s of rate-limited calls")
        cluster.assert_no_tracebacks()
    calls = sum(1 for at in handler.at if start <= at < end)
    rate = calls / WINDOW
    assert RATE * 0.9 <= rate <= RATE * 1.1, f"{rate:.1f} calls/s over {WINDOW} s"


async def test_a_retry_after_stops_every_processors_calls_and_costs_no_attempt(
        tmp_path: Path) -> None:
    handler = Arrivals(throttle_at=40, retry_after=3)
    async with Cluster(tmp_path, handler, name="block") as cluster:
        for n in range(3):
            await cluster.client.create_partition(
                f"p{n}", [NewItem(f"i{m}", b"{}") for m in range(100)])
        url = f"{cluster.base_url}/"
        for _ in range(3):
            # No retries: an item that lost an attempt to the 429 would fail.
            await cluster.start(None, "--rate-limit", "200", "--max-retries", "0",
                                handler_url=url)
        settled = await cluster.wait_settled([f"p{n}" for n in range(3)], timeout=60)
        cluster.assert_no_tracebacks()
    assert {info.status for info in settled.values()} == {"complete"}
    assert handler.throttled is not None
    # Calls already on their way when the 429 came back may still land; once the hold
    # reaches every processor (a poll), none does until the three seconds are over.
    slack = 0.5
    during = [at - handler.throttled for at in handler.at
              if handler.throttled + slack < at < handler.throttled + 2.9]
    assert during == [], f"calls {during} s into the hold"
    after = [at for at in handler.at if at >= handler.throttled + 2.9]
    assert after, "the calls came back after the hold"


class ByPartition:
    """A handler service that notes each item call's arrival with its partition, and
    answers its first call 429 with ``Retry-After: retry_after``."""

    def __init__(self, retry_after: int) -> None:
        self.retry_after = retry_after
        self.calls: list[tuple[float, str]] = []
        self.throttled: float | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        if scope["method"] == "GET":
            await send_json(send, 200, {})
            return
        headers = dict(scope["headers"])
        self.calls.append((time.monotonic(), headers[b"x-partition-id"].decode()))
        if self.throttled is None:
            self.throttled = time.monotonic()
            await send_json(send, 429, {"error": {"message": "slow down"}},
                            headers=[("retry-after", str(self.retry_after))])
            return
        await send_json(send, 200, {"done": True})


ROUTES = """
[[pipeline]]
name = "{pipeline}"
[[pipeline.route]]
gate = "*"
url = "{url}"
"""


async def test_a_processor_started_during_a_services_hold_waits_it_out(
        tmp_path: Path) -> None:
    # Two pipelines route to one service; processor A (pipeline one) meets its 429, and
    # processor B (pipeline two), started during the hold, has never called it.
    hold, read_late = 6, 1.5
    service = ByPartition(retry_after=hold)
    async with Cluster(tmp_path, service, name="svchold") as cluster:
        url = f"{cluster.base_url}/s"
        for pipeline in ("one", "two"):
            (tmp_path / f"{pipeline}.toml").write_text(ROUTES.format(pipeline=pipeline,
                                                                      url=url))
        await cluster.client.create_partition("a", [NewItem(f"i{m}", b"{}") for m in range(3)],
                                              pipeline="one")
        await cluster.start(None, "--routes", str(tmp_path / "one.toml"), "--max-retries",
                            "0", handler_url="")
        await wait_until(lambda: cluster.client.flow_controls("handler"), timeout=30,
                         message="the service's hold stored for the fleet")
        await cluster.client.create_partition("b", [NewItem(f"i{m}", b"{}") for m in range(3)],
                                              pipeline="two")
        await cluster.start(None, "--routes", str(tmp_path / "two.toml"), "--max-retries",
                            "0", handler_url="")
        settled = await cluster.wait_settled(["a", "b"], timeout=60)
        cluster.assert_no_tracebacks()
    assert {info.status for info in settled.values()} == {"complete"}
    assert service.throttled is not None
    early = [round(at - service.throttled, 2) for at, partition in service.calls
             if partition == "b" and at < service.throttled + hold - read_late]
    assert early == [], f"B called the service {early} s into its {hold} s hold"
    assert any(partition == "b" for _, partition in service.calls)
