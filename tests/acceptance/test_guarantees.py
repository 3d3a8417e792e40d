"""What statefeed promises, checked from the outside: real ``processor run``
subprocesses on PostgreSQL, a recording handler on loopback, and crashes,
pauses and database outages inflicted on purpose (see ``harness/``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

import pytest
from sqlalchemy import text

from processor import ItemInfo, NewItem
from tests.acceptance.harness.checks import (
    causality_problems,
    duplicate_calls,
    gate_order_problems,
    item_problems,
    key_problems,
    trail_of,
)
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.database import closed_port, postgres_address, via
from tests.acceptance.harness.faults import TcpProxy, pause_outside_transaction
from tests.acceptance.harness.handler import Call, RecordingHandler, expected_trail, initial_data
from tests.acceptance.harness.processes import LEASE, POLL, START_DEADLINE, Processor, warning_lines
from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.engine import wait_until
from watcher.store.drivers.postgresql.engine import STUCK_TRANSACTION_SECONDS

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

# Takeover after a crash takes the rest of the lease and one poll; these tests hold it
# to that bound times LOADED_MARGIN, which a machine whose cores are busy with other work
# meets (a fixed 0.75 s and later 1.5 s of room did not). Its figures on a quiet machine
# are measured by the benchmark (bench/failover.py), not asserted.
LOADED_MARGIN = 3.0
# The lease of the SIGTERM handoff test: long enough that no lease can expire while the
# handoff is watched, so a takeover seen before the old lease's end was a release.
HANDOFF_LEASE = 30.0


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()


def assert_exact(cluster: Cluster, handler: RecordingHandler, items, layout) -> None:
    """Every item ends with exactly its steps, written from calls made for them."""
    problems = item_problems(items, handler.calls, gates=handler.gates, passes=handler.passes)
    problems += key_problems(handler.calls) + causality_problems(handler.calls)
    problems += handler.violations
    assert not problems, "\n".join(problems[:20]) + "\n" + cluster.log_tail()
    assert len(items) == sum(len(ids) for ids in layout.values())


async def two_holders(cluster: Cluster, *args: str, items: int
                      ) -> tuple[dict[str, list[str]], Processor, Processor, dict[str, list[str]]]:
    """Create four partitions of ``items`` items each and start two processors; wait
    until each holds two. Returns the layout, both processors, and owner -> the
    partitions it holds.

    Raises:
        AssertionError: they did not split the partitions two and two within 30 s.
    """
    layout = await cluster.create(4, items)
    first, second = await cluster.start_many(2, *args)

    async def two_each() -> dict[str, list[str]] | None:
        owners = await cluster.live_owners()
        counts = {owner: len(ids) for owner, ids in owners.items()}
        return owners if counts == {first.owner: 2, second.owner: 2} else None

    # The second gets its two at the first's balancing, each third of a lease: with a
    # long lease (``--lease-duration`` in ``args``) that takes a while.
    lease = float(args[args.index("--lease-duration") + 1]) if "--lease-duration" in args \
        else LEASE
    owners = await wait_until(two_each, timeout=max(30.0, lease * LOADED_MARGIN),
                              message="two partitions each")
    return layout, first, second, owners


async def holds_throughout(seconds: float, check: Callable[[], Awaitable[None]], *,
                           interval: float = 0.1) -> None:
    """Run ``check`` every ``interval`` for ``seconds``: an invariant that must hold over
    a stretch of time (the sleep paces the looking; nothing is awaited to happen).

    Raises:
        AssertionError: from ``check``, the first time the invariant breaks.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await check()
        await asyncio.sleep(interval)


class Takeover:
    """The fencing scenario: one partition of four items; its first owner gets all
    four gate-0 calls in flight and held (until ``first_calls`` is set). A second
    processor, ``new``, takes the partition over once the first owner's lease
    lapses, moves item0 and item1 through gate 0 and holds item2 and item3 in
    flight there (until the scenario finishes).
    """

    def __init__(self, first: str) -> None:
        self.first = first
        self.layout: dict[str, list[str]] = {}
        self.partition_id = ""
        self.first_calls = asyncio.Event()
        self.new_calls = asyncio.Event()
        self.handler = RecordingHandler(gates=2, passes=2, hold=self._hold)

    def _hold(self, call: Call) -> asyncio.Event | None:
        if call.caller == self.first and call.gate == 0:
            return self.first_calls
        if call.caller == "new" and call.item_id in ("item2", "item3") and call.step == (0, 0):
            return self.new_calls
        return None

    async def start(self, cluster: Cluster, *, db_url: str | None = None) -> Processor:
        """Start the first owner (with a health port) until its four calls are in
        flight, then ``new``; returns the first owner.

        Raises:
            AssertionError: the calls were not in flight within 30 s, or ``new`` did
                not start within 20 s.
        """
        self.layout = await cluster.create(1, 4)
        [self.partition_id] = self.layout
        first = await cluster.start(self.first, health=True, db_url=db_url)
        await wait_until(lambda: len(self.handler.in_flight(first.owner)) == 4, timeout=30,
                         message="four calls in flight")
        new = await cluster.start("new")
        await new.wait_log("action=watcher_started")
        return first

    async def wait_taken_over(self, cluster: Cluster, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until ``new`` holds the partition.

        Raises:
            AssertionError: it did not within ``timeout`` seconds.
        """
        async def taken() -> bool:
            return (await cluster.partitions())[self.partition_id].owner == "new"

        await wait_until(taken, timeout=timeout, message="the new owner takes over")

    async def items(self, cluster: Cluster) -> dict[str, ItemInfo]:
        """The partition's items by id."""
        return {item.id: item for item in await cluster.client.items(self.partition_id)}

    async def new_owner_progress(self, cluster: Cluster) -> dict[str, ItemInfo]:
        """Wait until ``new`` has moved item0 and item1 to gate 1 and holds item2 and
        item3 in flight; returns the items as they are then.

        Raises:
            AssertionError: that did not happen within the deadlines (20 s, then 10 s).
        """
        async def moved_on() -> bool:
            items = await self.items(cluster)
            return items["item0"].gate == items["item1"].gate == 1

        await wait_until(moved_on, timeout=20, message="progress by the new owner")
        await wait_until(lambda: len(self.handler.in_flight("new")) == 2, timeout=10,
                         message="item2 and item3 in flight at the new owner")
        return await self.items(cluster)

    async def finish(self, cluster: Cluster) -> list[ItemInfo]:
        """Release ``new``'s held calls, wait until the partition completes, check every
        item ended exactly; returns the items.

        Raises:
            AssertionError: the partition did not complete within 30 s, an item did
                not end exactly, or a processor printed a traceback.
        """
        self.new_calls.set()
        infos = await cluster.wait_settled([self.partition_id], timeout=30)
        assert infos[self.partition_id].status == "complete"
        items = await cluster.items(self.layout)
        assert_exact(cluster, self.handler, items, self.layout)
        cluster.assert_no_tracebacks()
        return items


# --------------------------------------------------------------------------- 1


async def test_every_step_is_applied_exactly_once(tmp_path) -> None:
    """Calls are at least once, state transitions exactly once, through a kill -9 and a
    SIGTERM: every item's pass counter ends exactly right, every step was written
    from a successful call for it, and repeated calls share their Idempotency-Key.
    """
    delays = random.Random(1)
    handler = RecordingHandler(gates=3, passes=2, failure_rate=0.1, seed=1,
                               delay=lambda call: delays.uniform(0.01, 0.08))
    async with Cluster(tmp_path, handler) as cluster:
        layout = await cluster.create(12, 4)
        first, second, _ = await cluster.start_many(3)
        await wait_until(lambda: len(handler.calls) >= 60, timeout=30, message="60 calls")
        first.kill()
        await cluster.start()
        await wait_until(lambda: len(handler.calls) >= 150, timeout=30, message="150 calls")
        assert await second.terminate() == 0, second.stderr()
        await cluster.start()
        infos = await cluster.wait_settled(layout, timeout=60)
        assert {infos[pid].status for pid in layout} == {"complete"}
        items = await cluster.items(layout)
        assert_exact(cluster, handler, items, layout)
        cluster.assert_no_tracebacks()
    outcomes = [call.outcome for call in handler.calls]
    assert outcomes.count("transient") > 0, "the run must include retried failures"
    print(f"\nexactly-once: items={len(items)} calls={len(handler.calls)} "
          f"transient={outcomes.count('transient')} duplicates={duplicate_calls(handler.calls)}")


# --------------------------------------------------------------------------- 2


async def test_gate_order_holds_across_processors_and_crashes(tmp_path) -> None:
    """No item is dispatched at gate g+1 before every item of its partition settled gate g.

    Each gate has a straggler (a different item per gate takes much longer), so
    the other items wait at the barrier; a processor is killed while stragglers
    are in flight.
    """
    items_per_partition = 4

    def delay(call: Call) -> float:
        straggler = f"item{call.gate % items_per_partition}"
        return 0.3 if call.item_id == straggler else 0.01

    handler = RecordingHandler(gates=4, passes=2, failure_rate=0.05, seed=2, delay=delay)
    async with Cluster(tmp_path, handler) as cluster:
        layout = await cluster.create(6, items_per_partition)
        procs = await cluster.start_many(3)
        await wait_until(lambda: any(call.gate >= 1 for call in handler.calls), timeout=30,
                         message="gate-1 calls")
        busiest = max(procs, key=lambda proc: len(handler.in_flight(proc.owner)))
        busiest.kill()
        await cluster.start()
        await cluster.wait_settled(layout, timeout=60)
        items = await cluster.items(layout)
        assert_exact(cluster, handler, items, layout)
        cluster.assert_no_tracebacks()
    problems = gate_order_problems(handler.calls, layout, passes=handler.passes)
    assert not problems, "\n".join(problems[:20])
    later = [call for call in handler.calls if call.gate >= 1]
    assert len(later) >= 6 * items_per_partition * 3 * 2
    # How close the barrier came: the tightest gap between a gate settling and the
    # next gate's first call in the same partition.
    slack = min(_barrier_slack(handler.calls, layout, handler.passes))
    print(f"\ngate order: calls={len(handler.calls)} next-gate calls checked={len(later)} "
          f"tightest barrier gap={slack * 1000:.1f} ms")


def _barrier_slack(calls: list[Call], layout: dict[str, list[str]], passes: int):
    """Per partition and gate: first call at the gate minus the moment the previous
    gate's last item settled (its first successful last-pass call finished)."""
    for partition_id, item_ids in layout.items():
        mine = [call for call in calls if call.partition_id == partition_id]
        for gate in range(1, max(call.gate for call in mine) + 1):
            settled = max(
                min(call.finished for call in mine if call.item_id == item_id and call.ok
                    and call.step == (gate - 1, passes - 1))
                for item_id in item_ids)
            first = min(call.started for call in mine if call.gate == gate)
            yield first - settled


# --------------------------------------------------------------------------- 3


async def test_failover_after_kill_9_within_a_lease(tmp_path) -> None:
    """kill -9 leaves leases behind; the survivor takes each over within the rest of
    the lease plus one poll, never before the dead owner's lease expired, and
    finishes the work exactly.
    """
    hold = asyncio.Event()
    handler = RecordingHandler(gates=2, passes=2, hold=lambda call: hold)
    async with Cluster(tmp_path, handler) as cluster:
        layout, victim, survivor, owners = await two_holders(cluster, items=3)
        await wait_until(lambda: len(handler.in_flight(victim.owner)) == 6, timeout=10,
                         message="the victim's items in flight")
        victim.kill()
        killed_at = time.monotonic()
        await victim.wait(10)
        # The victim's leases as it left them (it can renew no more).
        before = {pid: info.until for pid, info in (await cluster.partitions()).items()
                  if pid in owners[victim.owner]}
        taken_at: dict[str, float] = {}

        async def taken_over() -> bool:
            infos = await cluster.partitions()
            for pid in before:
                if pid not in taken_at and infos[pid].owner == survivor.owner:
                    taken_at[pid] = time.monotonic()
            return len(taken_at) == len(before)

        await wait_until(taken_over, timeout=(LEASE + POLL) * LOADED_MARGIN, interval=0.01,
                         message="the survivor takes over")
        after = await cluster.partitions()
        hold.set()
        await cluster.wait_settled(layout, timeout=30)
        assert_exact(cluster, handler, await cluster.items(layout), layout)
        cluster.assert_no_tracebacks()
    took = {pid: at - killed_at for pid, at in taken_at.items()}
    print(f"\nfailover after kill -9: {max(took.values()):.2f} s "
          f"(per partition: {', '.join(f'{t:.2f}' for t in sorted(took.values()))}; "
          f"bound {(LEASE + POLL) * LOADED_MARGIN:.2f} s)")
    assert max(took.values()) <= (LEASE + POLL) * LOADED_MARGIN
    for pid, until in before.items():
        # The new lease runs LEASE from the moment it was taken (database clock).
        taken = after[pid].until.timestamp() - LEASE
        assert taken >= until.timestamp() - 0.01, f"{pid} was taken before its lease expired"


async def test_pickup_after_kill_9_within_the_default_bound(tmp_path) -> None:
    """With the default lease and poll interval (no options), the items a killed
    processor held are dispatched again by the survivor within the documented bound:
    one default lease duration plus one poll interval (a deadline, not a benchmark).
    """
    from watcher.config import DEFAULT_LEASE_DURATION, DEFAULT_POLL_INTERVAL

    hold = asyncio.Event()
    handler = RecordingHandler(gates=1, passes=1, hold=lambda call: hold)
    async with Cluster(tmp_path, handler) as cluster:
        layout = await cluster.create(4, 3)
        procs = [await cluster.start(None, fast=False) for _ in range(2)]
        await asyncio.gather(*(proc.wait_log("action=watcher_started") for proc in procs))
        owners = await wait_until(
            lambda: _split_two_and_two(cluster, procs), timeout=60, message="two each")
        victim, survivor = procs
        await wait_until(lambda: len(handler.in_flight(victim.owner)) == 6, timeout=20,
                         message="the victim's items in flight")
        victim.kill()
        killed_at = time.monotonic()
        await victim.wait(10)
        bound = DEFAULT_LEASE_DURATION + DEFAULT_POLL_INTERVAL
        victims = set(owners[victim.owner])
        await wait_until(
            lambda: len({call.partition_id for call in handler.in_flight(survivor.owner)
                         if call.partition_id in victims}) == len(victims),
            timeout=bound * 3, interval=0.02, message="the survivor dispatches them")
        took = time.monotonic() - killed_at
        hold.set()
        await cluster.wait_settled(layout, timeout=60)
        cluster.assert_no_tracebacks()
    print(f"\npickup after kill -9 at default settings: {took:.2f} s (bound {bound:.1f} s)")
    # The survivor's poll and its first calls run on a machine other work loads too.
    assert took <= bound * LOADED_MARGIN


async def _split_two_and_two(cluster: Cluster, procs: list[Processor]
                             ) -> dict[str, list[str]] | None:
    owners = await cluster.live_owners()
    counts = {owner: len(ids) for owner, ids in owners.items()}
    return owners if counts == {proc.owner: 2 for proc in procs} else None


# --------------------------------------------------------------------------- 4


async def test_handoff_after_sigterm_is_immediate(tmp_path) -> None:
    """SIGTERM finishes in-flight calls, writes them, releases the leases and exits 0;
    the other processor owns the partitions before the leases the leaving one held
    would have ended (by the database's clock): a release, not an expiry.
    """
    handler = RecordingHandler(gates=2, passes=20, delay=0.04)
    async with Cluster(tmp_path, handler) as cluster:
        # At most two partitions each: they split two and two at once, however long the
        # lease (balancing by hand-over takes renewals a third of a lease apart).
        layout, leaving, staying, owners = await two_holders(
            cluster, "--lease-duration", str(HANDOFF_LEASE), "--max-leases", "2", items=2)
        await wait_until(lambda: handler.in_flight(leaving.owner), timeout=10,
                         message="calls in flight")
        held_until = {pid: info.until for pid, info in (await cluster.partitions()).items()
                      if pid in owners[leaving.owner]}
        stopping = asyncio.create_task(leaving.terminate())
        signalled_at = time.monotonic()
        released_at: dict[str, float] = {}
        taken_at: dict[str, float] = {}
        seen_at: list[datetime] = []

        async def handed_over() -> bool:
            infos = await cluster.partitions()
            now = time.monotonic()
            for pid in owners[leaving.owner]:
                if infos[pid].owner != leaving.owner:
                    released_at.setdefault(pid, now)
                if infos[pid].owner == staying.owner or infos[pid].status == "complete":
                    taken_at.setdefault(pid, now)
            if len(taken_at) == 2:
                seen_at.append(await cluster.client.now())
                return True
            return False

        # A deadline, not the check: the database's clock below says it was a release.
        await wait_until(handed_over, timeout=HANDOFF_LEASE * LOADED_MARGIN, interval=0.01,
                         message="the other processor takes over")
        assert await stopping == 0, leaving.stderr()
        assert "action=leases_released" in leaving.stderr()
        await cluster.wait_settled(layout, timeout=60)
        assert_exact(cluster, handler, await cluster.items(layout), layout)
        cluster.assert_no_tracebacks()
    released = max(released_at.values()) - signalled_at
    took = max(taken_at.values()) - signalled_at
    print(f"\nhandoff after SIGTERM: released in {released:.2f} s, taken over in {took:.2f} s")
    # Taken over while the old leases still ran: released by the leaving processor, not
    # left to expire (a renewal after the reading only moved their ends later).
    assert seen_at[0].timestamp() < min(until.timestamp() for until in held_until.values()), (
        seen_at, held_until)


# --------------------------------------------------------------------------- 5


async def test_a_paused_processor_is_fenced_off(tmp_path) -> None:
    """SIGSTOP a lease holder with calls in flight until another processor has taken
    the partition over and made progress; after SIGCONT its results arrive, but
    none is written: not over items the new owner moved on (the version guard),
    nor over items whose new calls are still in flight (only the lease fence
    stands there). It notices that it lost the lease.
    """
    takeover = Takeover("paused")
    handler = takeover.handler
    async with Cluster(tmp_path, handler) as cluster:
        paused = await takeover.start(cluster)
        await pause_outside_transaction(paused, cluster.db)
        paused_at = time.monotonic()
        await takeover.wait_taken_over(cluster, timeout=LEASE * 3)
        took = time.monotonic() - paused_at
        before = await takeover.new_owner_progress(cluster)
        # The paused processor's calls are answered while it cannot read the answers.
        takeover.first_calls.set()
        await wait_until(lambda: not handler.in_flight(paused.owner), timeout=10,
                         message="answers to the paused processor")
        paused.resume()
        await paused.wait_log("action=lease_lost", timeout=LEASE * 3)
        metrics = await paused.metrics()
        assert metrics['statefeed_lease_events_total{event="lost"}'] >= 1
        now = await takeover.items(cluster)
        assert now == before, "the fenced-off processor wrote over the new owner's items"
        items = await takeover.finish(cluster)
    paused_seqs = {call.seq for call in handler.calls_by(paused.owner)}
    assert len(paused_seqs) == 4
    written_from = {seq for item in items for _, seq in trail_of(item)}
    assert not written_from & paused_seqs, "results of the paused processor were written"
    stale = sum(value for name, value in metrics.items()
                if name.startswith("statefeed_stale_results_total"))
    print(f"\nfencing: taken over {took:.2f} s after SIGSTOP; none of the paused processor's "
          f"4 results written (it counted {stale:.0f} as stale before noticing the loss)")


async def test_results_computed_under_a_lost_lease_are_fenced_off(tmp_path) -> None:
    """A processor cut off from the database (a network partition: connections hang)
    gets its handler answers while another processor takes the partition over.
    When the network heals, its queued result writes reach the database and every
    one is refused by the lease fence, even for items whose version still matches.
    """
    takeover = Takeover("cut")
    handler = takeover.handler
    async with Cluster(tmp_path, handler) as cluster, TcpProxy(*postgres_address()) as proxy:
        proxy.forward()
        cut = await takeover.start(cluster, db_url=via(POSTGRES_URL, proxy.port))
        proxy.stall()
        takeover.first_calls.set()  # the answers arrive; the result writes hang
        # If the stall caught the cut-off processor inside a lease write, its session
        # keeps the partition row locked until PostgreSQL ends it as stuck.
        await takeover.wait_taken_over(
            cluster, timeout=max(LEASE * 3, STUCK_TRANSACTION_SECONDS + LEASE))
        before = await takeover.new_owner_progress(cluster)
        proxy.forward()
        await cut.wait_log("action=lease_lost", timeout=LEASE * 3)
        # The queued writes went out when the network healed; once the processor's
        # sessions are out of their transactions, they have been answered.
        await wait_until(lambda: cluster.db.no_transaction(cut.owner), timeout=10,
                         message="the cut-off processor's writes to finish")
        metrics = await cut.metrics()
        now = await takeover.items(cluster)
        assert now == before, "a result computed under a lost lease was written"
        items = await takeover.finish(cluster)
    cut_seqs = {call.seq for call in handler.calls_by(cut.owner)}
    assert not {seq for item in items for _, seq in trail_of(item)} & cut_seqs
    # The four writes reached the database either way; whether the processor counts
    # them as stale depends on whether it noticed the lost lease (and cancelled the
    # attempts) before their answers came back.
    stale = sum(value for name, value in metrics.items()
                if name.startswith("statefeed_stale_results_total"))
    print(f"\nfencing after a network partition: 4 results computed under the lost lease, "
          f"none written ({stale:.0f} counted as stale)")


# --------------------------------------------------------------------------- 6

OUTAGES = 4


async def test_database_connection_drops_are_survived(tmp_path) -> None:
    """pg_terminate_backend on every processor session, several times mid-run: the
    processors keep running, log a line per state change (no tracebacks, no line
    per poll), resume on their own, and every item ends exactly right.
    """
    delays = random.Random(6)
    handler = RecordingHandler(gates=3, passes=3, seed=6,
                               delay=lambda call: delays.uniform(0.05, 0.2))
    async with Cluster(tmp_path, handler) as cluster:
        layout = await cluster.create(10, 5)
        total = 10 * 5 * 3 * 3
        procs = await cluster.start_many(3, health=True)
        terminated = []
        for outage in range(OUTAGES):
            threshold = total * (outage + 1) // (OUTAGES + 2)
            await wait_until(lambda threshold=threshold: len(handler.calls) >= threshold,
                             timeout=60, message=f"{threshold} calls")
            # A burst, so that sessions in the middle of a transaction die too.
            for _ in range(5):
                terminated.append(await cluster.db.terminate())
                await asyncio.sleep(0.03)
        await cluster.wait_settled(layout, timeout=90)
        items = await cluster.items(layout)
        assert_exact(cluster, handler, items, layout)
        for proc in procs:
            assert proc.running, f"{proc.owner} exited:\n{proc.stderr()[-3000:]}"
            assert (await proc.get("/readyz")).status_code == 200
        cluster.assert_no_tracebacks()
        # A loop whose last pass failed logs its recovery at its next pass, after its
        # back-off: wait for that line rather than read the logs before it is written.
        await wait_until(lambda: all(_recovered(warning_lines(proc.stderr())) for proc in procs),
                         timeout=30, message="every processor logs its recovery")
        logs = {proc.owner: proc.stderr() for proc in procs}
    assert sum(terminated) >= OUTAGES, terminated
    counts = {}
    for owner, log in logs.items():
        warnings = warning_lines(log)
        counts[owner] = len(warnings)
        # Per outage: the lease loop and the result writer each say "unavailable"
        # and "recovered" once, and each other loop (notify listener, rate limits,
        # schedule ticker, timeline hand-over, processor registration) at most once
        # that it failed; a line per poll would be dozens per outage.
        assert len(warnings) <= 9 * OUTAGES, f"{owner} logged too much:\n" + "\n".join(warnings)
        for failed, recovered in RECOVERIES:
            states = [line for line in warnings if failed in line or recovered in line]
            assert not states or recovered in states[-1], f"{owner} did not recover: {states}"
    assert any(counts.values()), "no processor noticed a dropped connection"
    print(f"\ndatabase drops: {OUTAGES} bursts, {sum(terminated)} sessions terminated; "
          f"warning lines per processor: {counts}")


# --------------------------------------------------------------------------- 7


async def test_poison_items_fail_without_blocking_their_gate(tmp_path) -> None:
    """An item the handler always rejects fails after its retry budget (or at once on a
    4xx) with its last error; the rest of its gate is still attempted and settles,
    its partition fails at that gate, and other partitions are not held up.
    """
    handler = RecordingHandler(gates=2, passes=2, poison={"poison"}, delay=0.02)
    refused = RecordingHandler(gates=2, passes=2, poison={"refused"}, poison_status=422)

    def answer(call: Call):
        # One handler, two kinds of poison: "refused" gets a 4xx (final at once).
        if call.item_id == "refused":
            return refused.answer(call)[:2]
        return None

    handler.respond = answer
    retries = 3
    async with Cluster(tmp_path, handler) as cluster:
        await cluster.client.create_partition(
            "mixed", [NewItem(f"item{n}", initial_data()) for n in range(5)]
            + [NewItem("poison", initial_data())])
        await cluster.client.create_partition(
            "refusing", [NewItem(f"item{n}", initial_data()) for n in range(3)]
            + [NewItem("refused", initial_data())])
        layout = {"clean": [f"item{n}" for n in range(4)]}
        await cluster.client.create_partition(
            "clean", [NewItem(item_id, initial_data()) for item_id in layout["clean"]])
        await cluster.start_many(2, "--max-retries", str(retries), "--retry-backoff", "0.05")
        infos = await cluster.wait_settled(["mixed", "refusing", "clean"], timeout=60)
        assert infos["mixed"].status == "failed" and infos["mixed"].gate == 0
        assert infos["refusing"].status == "failed" and infos["refusing"].gate == 0
        assert infos["clean"].status == "complete"
        mixed = {item.id: item for item in await cluster.client.items("mixed")}
        refusing = {item.id: item for item in await cluster.client.items("refusing")}
        assert_exact(cluster, handler, await cluster.items(["clean"]), layout)
        cluster.assert_no_tracebacks()

    poison = mixed.pop("poison")
    assert poison.status == "failed" and poison.gate == 0
    assert poison.attempts == retries + 1
    assert "poison item poison" in poison.last_error and "500" in poison.last_error
    calls = [call for call in handler.calls if call.item_id == "poison"]
    assert [call.attempt for call in calls] == list(range(1, retries + 2))
    assert len({call.key for call in calls}) == 1, "retries of one step share one key"

    final = refusing.pop("refused")
    assert final.status == "failed" and final.attempts == 1
    assert "422" in final.last_error and "poison item refused" in final.last_error
    assert len([call for call in handler.calls if call.item_id == "refused"]) == 1

    for item in [*mixed.values(), *refusing.values()]:
        # The rest of the gate was attempted and settled: both passes made, the item
        # waits at gate 1, which never opens because the gate cannot complete.
        assert item.status == "available" and item.gate == 1, item
        assert [step for step, _ in trail_of(item)] == expected_trail(1, 2)
    assert not [call for call in handler.calls
                if call.partition_id in ("mixed", "refusing") and call.gate > 0]
    print(f"\npoison: failed after {poison.attempts} attempts: {poison.last_error}")


UNPAID = 2  # --max-unpaid-retries: the binary page is a proxy's, an outage
UNSTORABLE = {
    # A proxy's binary error page: the excerpt kept as last_error holds a NUL byte.
    "binary-page": b"\x00\x01\x02 bad gateway",
    # JSON error messages PostgreSQL text cannot hold, or UTF-8 cannot encode.
    "nul-message": b'{"error": {"message": "nul \\u0000 inside"}}',
    "surrogate-message": b'{"error": {"message": "lone \\ud800 surrogate"}}',
}


async def test_a_poison_answer_that_cannot_be_stored_fails_only_its_item(tmp_path) -> None:
    """Error answers whose text cannot be stored verbatim must still fail just their
    item after the retry budget; the other partitions of the processor go on.
    """
    def respond(call: Call):
        body = UNSTORABLE.get(call.item_id)
        return None if body is None else (502, body)

    handler = RecordingHandler(gates=2, passes=2, respond=respond)
    retries = 1
    async with Cluster(tmp_path, handler) as cluster:
        for item_id in UNSTORABLE:
            await cluster.client.create_partition(item_id, [NewItem(item_id, initial_data())])
        layout = await cluster.create(3, 2)
        # The bare 502 is a proxy's answer: an outage, unpaid up to the bound, then charged.
        proc = await cluster.start("only", "--max-retries", str(retries),
                                   "--max-unpaid-retries", str(UNPAID))
        infos = await cluster.wait_settled([*UNSTORABLE, *layout], timeout=30)
        poisoned = await cluster.items(UNSTORABLE)
        assert_exact(cluster, handler, await cluster.items(layout), layout)
        log = proc.stderr()
    assert all(infos[pid].status == "complete" for pid in layout)
    for item in poisoned:
        assert item.status == "failed" and item.attempts == retries + 1, item
        assert "502" in (item.last_error or ""), item
    for item_id in UNSTORABLE:
        calls = [call for call in handler.calls if call.item_id == item_id]
        unpaid = UNPAID if item_id == "binary-page" else 0
        assert len(calls) == unpaid + retries + 1, f"{item_id}: {len(calls)} calls"
    assert "Traceback" not in log and "result_write_failed" not in log


# --------------------------------------------------------------------------- 8


async def test_start_up_without_a_database_waits_and_recovers(tmp_path) -> None:
    """With the database down, ``processor run`` keeps running and retrying with one
    log line, /healthz answers 200 and /readyz 503; when the database comes up it
    starts working without a restart.
    """
    handler = RecordingHandler(gates=2, passes=2)
    async with Cluster(tmp_path, handler) as cluster, TcpProxy(*postgres_address()) as proxy:
        layout = await cluster.create(2, 3)
        proc = await cluster.start("waiting", health=True, db_url=via(POSTGRES_URL, proxy.port))
        line = await proc.wait_log("action=database_wait")
        assert "retrying" in line
        await wait_until(lambda: proxy.accepted >= 3, timeout=20, message="three connection tries")
        assert proc.running
        health = await wait_until(lambda: proc.answer("/healthz"), timeout=START_DEADLINE,
                                  message="/healthz")
        assert health.status_code == 200
        ready = await proc.get("/readyz")
        assert ready.status_code == 503 and not ready.json()["checks"]["database"]["ok"]
        tries = proxy.accepted
        proxy.forward()
        await proc.wait_log("action=watcher_started")
        await cluster.wait_settled(layout, timeout=30)
        assert_exact(cluster, handler, await cluster.items(layout), layout)
        assert (await proc.get("/readyz")).status_code == 200
        assert await proc.terminate() == 0
        log = proc.stderr()
    assert log.count("action=database_wait") == 1, log
    assert "Traceback" not in log
    print(f"\nstart-up without a database: waited through {tries} connection attempts, "
          "then processed")


async def test_start_up_without_a_database_can_exit_instead(tmp_path) -> None:
    """``--exit-on-db-error``: exit 1 with one line and no traceback."""
    async with Cluster(tmp_path) as cluster:
        proc = await cluster.start("leaving", "--exit-on-db-error",
                                   db_url=via(POSTGRES_URL, closed_port()),
                                   handler_url="http://127.0.0.1:9/")
        code = await proc.wait(30)
        output = proc.output()
    assert code == 1, output
    assert "Traceback" not in output
    # Its start-up line (what it runs with), then the error: one line.
    starting, *lines = output.strip().splitlines()
    assert "action=starting owner=leaving" in starting, output
    assert len(lines) == 1 and "unavailable" in lines[0], output


# --------------------------------------------------------------------------- 9


async def test_partitions_balance_across_processes(tmp_path) -> None:
    """3 processors over 30 busy partitions settle at 10 ± 1 each; a fourth that joins
    gets its share handed over within a few lease cycles: at least floor(30/4) - 1,
    and nobody above ceil(30/4) + 1. Nothing is lost by the hand-overs.
    """
    hold = asyncio.Event()
    handler = RecordingHandler(gates=1, passes=1, hold=lambda call: hold)
    async with Cluster(tmp_path, handler) as cluster:
        layout = await cluster.create(30, 1)
        procs = await cluster.start_many(3)

        async def shares(low: int, high: int, owners: int, *,
                         lapsed_too: bool = False) -> dict[str, int] | None:
            held = await cluster.live_owners(lapsed_too=lapsed_too)
            live = {owner: len(ids) for owner, ids in held.items()}
            fits = (len(live) == owners and sum(live.values()) == 30
                    and all(low <= count <= high for count in live.values()))
            return live if fits else None

        settled = await wait_until(lambda: shares(9, 11, 3), timeout=30, interval=0.05,
                                   message="10 ± 1 partitions each")
        # And it stays settled: no flapping over a lease (three renew cycles). Judged by
        # the owner each row names: a renewal that a busy machine delays past its lease
        # is no hand-over, and a partition that changed hands is still seen.
        async def still_settled() -> None:
            held = await cluster.live_owners(lapsed_too=True)
            assert await shares(9, 11, 3, lapsed_too=True), {
                owner: len(ids) for owner, ids in held.items()}

        await holds_throughout(LEASE, still_settled)
        fourth = await cluster.start("fourth")
        first_lease = await fourth.wait_log("action=lease_acquired", timeout=30)
        joined_at = time.monotonic()
        final = await wait_until(lambda: shares(30 // 4 - 1, -(-30 // 4) + 1, 4),
                                 timeout=4 * LEASE, interval=0.05, message="the fourth's share")
        took = time.monotonic() - joined_at
        assert "stolen_from=" not in first_lease, "a hand-over, not a steal"
        assert final[fourth.owner] >= 30 // 4 - 1
        hold.set()
        await cluster.wait_settled(layout, timeout=30)
        assert_exact(cluster, handler, await cluster.items(layout), layout)
        cluster.assert_no_tracebacks()
    stolen = sum(proc.stderr().count("stolen_from=") for proc in [*procs, fourth])
    print(f"\nbalance: three settle at {sorted(settled.values())}; the fourth reaches its share "
          f"{took:.2f} s after its first lease: {dict(sorted(final.items()))}; {stolen} steals")


async def test_a_stuck_row_lock_costs_only_its_own_partition(tmp_path) -> None:
    """A session that stops inside a transaction (a client frozen in ``add_items``, a
    processor paused or cut off mid-write) keeps a partition row locked. Only that
    partition may be held up: the holder's other leases and the other processors'
    leases must stay live.
    """
    hold = asyncio.Event()
    handler = RecordingHandler(gates=1, passes=1, hold=lambda call: hold)
    async with Cluster(tmp_path, handler) as cluster:
        layout, first, second, owners = await two_holders(cluster, items=1)
        locked, *others = owners[first.owner]
        healthy = {pid: first.owner for pid in others}
        healthy.update({pid: second.owner for pid in owners[second.owner]})
        async with cluster.db.engine.connect() as conn:
            transaction = await conn.begin()
            # What a client's add_items does first, then (here) never commits.
            await conn.execute(text(f"UPDATE {cluster.prefix}partitions "
                                    "SET version = version + 1 WHERE id = :id"), {"id": locked})

            async def healthy_leases_live() -> None:
                live = await cluster.live_owners()
                lost = {pid: owner for pid, owner in healthy.items()
                        if pid not in live.get(owner, [])}
                assert not lost, f"leases lost while {locked} was locked: {lost}; {live}"

            try:
                await holds_throughout(2.5 * LEASE, healthy_leases_live)
            finally:
                await transaction.rollback()
        hold.set()
        await cluster.wait_settled(layout, timeout=30)


async def test_database_outage_longer_than_a_lease_is_survived(tmp_path) -> None:
    """The database goes away (connections cut, new ones refused) for longer than a
    lease while calls are in flight, then comes back: every lease has expired
    meanwhile, yet the processors resume on their own and every item ends exactly.
    """
    delays = random.Random(61)
    handler = RecordingHandler(gates=3, passes=2, seed=61,
                               delay=lambda call: delays.uniform(0.05, 0.2))
    async with Cluster(tmp_path, handler) as cluster, TcpProxy(*postgres_address()) as proxy:
        proxy.forward()
        layout = await cluster.create(6, 4)
        db_url = via(POSTGRES_URL, proxy.port)
        procs = [await cluster.start(None, db_url=db_url) for _ in range(2)]
        # Both must be running when the outage starts, not one still starting up.
        await asyncio.gather(*(proc.wait_log("action=watcher_started") for proc in procs))
        total = 6 * 4 * 3 * 2
        await wait_until(lambda: len(handler.calls) >= total // 3, timeout=60,
                         message="a third of the calls")
        proxy.reject()
        proxy.cut()
        down_at = time.monotonic()
        await asyncio.gather(*(proc.wait_log("action=database_unavailable") for proc in procs))
        # Stay down until every lease in the database has expired.
        await wait_until(lambda: _no_live_lease(cluster), timeout=LEASE * 2 * LOADED_MARGIN,
                         message="the leases to expire")
        down_for = time.monotonic() - down_at
        calls_while_down = len(handler.calls)
        proxy.forward()
        await cluster.wait_settled(layout, timeout=60)
        assert_exact(cluster, handler, await cluster.items(layout), layout)
        for proc in procs:
            assert proc.running
            await proc.wait_log("action=database_recovered")
            assert len(warning_lines(proc.stderr())) <= 9, proc.stderr()  # as above
        cluster.assert_no_tracebacks()
    print(f"\noutage longer than a lease: down {down_for:.1f} s; "
          f"{len(handler.calls) - calls_while_down} calls after it came back")


async def _no_live_lease(cluster: Cluster) -> bool:
    return not await cluster.live_owners()


RECOVERIES = (("database_unavailable", "database_recovered"),
              ("result_write_failed", "result_write_recovered"))


def _recovered(warnings: list[str]) -> bool:
    """Whether each failure these warning lines report is followed by its recovery."""
    for failed, recovered in RECOVERIES:
        states = [line for line in warnings if failed in line or recovered in line]
        if states and recovered not in states[-1]:
            return False
    return True
