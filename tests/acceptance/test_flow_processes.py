"""Flow control across real ``processor run`` processes (issue 26): a key's in-flight
limit through ``kill -9`` and rebalancing, fair queuing across keys, a pause that
outlives every processor, priority, and delays that are never early.

The key never reaches the handler; each partition's id is ``<key>-<n>``, so the
handler derives the key from the ``X-Partition-Id`` header
(:func:`~tests.acceptance.harness.flow.key_of`).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest

from processor import NewItem
from tests.acceptance.harness.checks import item_problems
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.flow import (
    DbClock,
    KeyLoad,
    first_calls,
    leases_taken,
    log_time,
)
from tests.acceptance.harness.handler import Call, RecordingHandler, initial_data
from tests.acceptance.harness.processes import LEASE, POLL
from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.engine import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

RENEW = LEASE / 3  # one lease cycle of the processors the harness starts


async def create_keyed(cluster: Cluster, key: str, partitions: int, items: int,
                       **settings: object) -> dict[str, list[str]]:
    """Create pass-counter partitions ``<key>-<n>`` of ``key``; returns id -> item ids."""
    layout = {f"{key}-{n:03d}": [f"i{m:03d}" for m in range(items)]
              for n in range(partitions)}
    for partition_id, item_ids in layout.items():
        await cluster.client.create_partition(
            partition_id, [NewItem(item_id, initial_data()) for item_id in item_ids],
            key=key, **settings)  # type: ignore[arg-type]
    return layout


# -- 1. a key's limit ------------------------------------------------------------------

LIMIT = 4


async def test_a_key_limit_holds_at_cold_start_through_kill_9_and_rebalancing(
        tmp_path) -> None:
    """Key ``a`` (8 partitions) has a fleet-wide limit of 4; key ``b`` has none.
    3 processors start cold, one is killed with ``kill -9`` while its calls of ``a``
    run on in the handler (for most of a lease) and is restarted under the same
    owner id, then a fourth joins and takes partitions over. The handler never sees
    more than 4 calls of ``a`` at once, in any phase."""
    require_postgres()
    rng = random.Random(26)
    load = KeyLoad(lambda call: rng.uniform(0.1, 0.3))
    handler = RecordingHandler(gates=1, passes=1, hold=load)
    async with Cluster(tmp_path, handler, name="fk") as cluster:
        layout = await create_keyed(cluster, "a", 8, 20)
        layout |= await create_keyed(cluster, "b", 3, 20)
        await cluster.client.set_key_limit("a", LIMIT)
        began = time.monotonic()
        procs = await cluster.start_many(3)

        def ended(key: str, caller: str | None = None, after: float = 0.0) -> int:
            return sum(1 for span in load.of(key) if span.ended is not None
                       and span.started > after and (caller is None or span.caller == caller))

        await wait_until(lambda: ended("a") >= 30, timeout=30, message="30 calls of a")
        cold = (began, time.monotonic())

        # The victim: a processor with calls of a running now.
        def busy() -> str | None:
            running = [span.caller for span in load.of("a") if span.ended is None]
            return max(set(running), key=running.count) if running else None

        owner = await wait_until(busy, timeout=10, message="a call of a in flight")
        victim = next(proc for proc in procs if proc.owner == owner)
        lingering = load.outlive(owner, 0.6 * LEASE)
        killed_at = time.monotonic()
        victim.kill()
        await victim.process.wait()
        shutil.copy(victim.stderr_path, tmp_path / f"{owner}.killed.err")
        restarted = await cluster.start(owner)
        await restarted.wait_log("action=watcher_started")
        restarted_at = time.monotonic()
        load.forget(owner)
        await wait_until(lambda: ended("a", owner, restarted_at) >= 3
                         and time.monotonic() > killed_at + LEASE, timeout=30,
                         message="the restarted processor's calls of a")
        kill = (killed_at, time.monotonic())

        joined_at = time.monotonic()
        joiner = await cluster.start(None)
        await joiner.wait_log("action=watcher_started")

        async def took_over() -> bool:
            held = (await cluster.live_owners()).get(joiner.owner, [])
            return bool(held) and ended("a", joiner.owner) >= 3

        await wait_until(took_over, timeout=30, message="the fourth processor's share")
        join = (joined_at, time.monotonic())
        await cluster.wait_settled(layout, timeout=60)
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()
        log_tail = cluster.log_tail(40)
        await load.close()

    phases = {name: load.most("a", *window)
              for name, window in (("cold start", cold), ("kill -9 and restart", kill),
                                   ("rebalancing", join), ("whole run", (began, time.monotonic())))}
    figures = (f"most calls of a at once: {phases}; b: {load.most('b')}; "
               f"{lingering} calls of the killed processor ran on; {len(handler.calls)} calls")
    assert lingering >= 1, f"the victim had no call of a in flight: {figures}"
    crowd = "\n".join(f"  {span}" for span in load.crowd("a", began, time.monotonic()))
    assert all(most <= LIMIT for most in phases.values()), (
        f"{figures}; killed at {killed_at:.3f}, restarted at {restarted_at:.3f}, fourth joined "
        f"at {joined_at:.3f}; the calls of a running at once:\n{crowd}\n{log_tail}")
    assert phases["whole run"] >= LIMIT - 1, f"the limit was never used: {figures}"
    assert load.most("b") > LIMIT, f"key b was held to a's limit: {figures}"
    problems = item_problems(items, handler.calls, gates=1, passes=1) + handler.violations
    assert not problems, "\n".join(problems[:20])
    print(f"\nkey limit {LIMIT} across 3+1 processors: {figures}")


# -- 2. fair queuing across keys -------------------------------------------------------

BURST = 2000


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
async def test_one_tenants_partition_starts_within_a_lease_cycle_behind_anothers_burst(
        tmp_path, database: str) -> None:
    """Tenant ``a`` has 2,000 one-item partitions and 3 processors are busy with them
    (50 leases and 4 calls each); tenant ``b``'s single partition, created then, gets
    its first call within one lease cycle (a third of the lease) of its insert."""
    sqlite_url = None if database == "postgres" else f"sqlite:///{tmp_path / 'statefeed.db'}"
    if sqlite_url is None:
        require_postgres()
    handler = RecordingHandler(gates=1, passes=1, delay=0.2)
    async with Cluster(tmp_path, handler, name="ff", db_url=sqlite_url or POSTGRES_URL
                       ) as cluster:
        for n in range(BURST):
            await cluster.client.create_partition(f"a-{n:04d}", [NewItem("i", initial_data())],
                                                  key="a")
        procs = [await cluster.start(None, "--max-leases", "50", "--concurrency", "4",
                                     db_url=sqlite_url)
                 for _ in range(3)]
        await asyncio.gather(*(proc.wait_log("action=watcher_started") for proc in procs))
        await wait_until(lambda: {call.caller for call in handler.calls} == {
            proc.owner for proc in procs} and len(handler.calls) >= 30, timeout=30,
            message="every processor busy with a's partitions")
        await cluster.client.create_partition("b-0000", [NewItem("i", initial_data())], key="b")
        inserted, inserted_wall = time.monotonic(), time.time()
        first = await wait_until(lambda: first_calls(handler.calls).get("b-0000"), timeout=30,
                                 message="b's first call")
        started_before = {call.partition_id for call in handler.calls
                          if call.started < first.started and call.partition_id != "b-0000"}
        leased = [log_time(stamp) for stamp, pid in leases_taken(proc.stderr() for proc in procs)
                  if pid == "b-0000"]
        cluster.assert_no_tracebacks()
    waited = first.started - inserted
    figures = (f"{database}: b's first call {waited:.3f} s after its insert (leased after "
               f"{leased[0] - inserted_wall:.3f} s); a's partitions started by then: "
               f"{len(started_before)} of {BURST}")
    assert waited < RENEW, f"{figures}; a lease cycle is {RENEW:.3f} s"
    assert len(started_before) < BURST // 2, f"a's burst was not waiting: {figures}"
    print(f"\nfairness, {figures}")


# -- 3. a pause outlives every processor -----------------------------------------------

PAUSE_GRACE = POLL + 0.4  # one poll, and the calls a read in progress had started


async def test_a_key_pause_outlives_a_kill_9_of_every_processor_and_resume_is_exact(
        tmp_path) -> None:
    """Key ``t`` is paused mid-run: its calls in flight finish and are written, and no
    new call starts after one poll (with a read's grace). Every processor is killed
    with ``kill -9`` and restarted; they run key ``u``'s new work for two leases and
    still start nothing of ``t``. After the resume, every item of ``t`` ends with each
    step written exactly once, from a successful call made for it (a call may repeat:
    calls are at least once, docs/explanation/guarantees.md)."""
    require_postgres()
    handler = RecordingHandler(gates=1, passes=2, delay=0.1)
    async with Cluster(tmp_path, handler, name="fp") as cluster:
        layout = await create_keyed(cluster, "t", 4, 40)
        procs = await cluster.start_many(3, "--concurrency", "4")
        await wait_until(lambda: sum(call.ok for call in handler.calls) >= 60, timeout=30,
                         message="60 calls of t")
        assert await cluster.client.pause_key("t") is True
        paused = time.monotonic()
        await wait_until(lambda: not handler.in_flight(), timeout=10,
                         message="t's calls in flight to finish")
        at_pause = len(handler.calls)
        for proc in procs:
            proc.kill()
        for proc in procs:
            await proc.process.wait()
            shutil.copy(proc.stderr_path, tmp_path / f"{proc.owner}.killed.err")
        restarted = [await cluster.start(proc.owner, "--concurrency", "4") for proc in procs]
        await asyncio.gather(*(proc.wait_log("action=watcher_started") for proc in restarted))
        since = await cluster.client.now()
        control = await create_keyed(cluster, "u", 2, 10)
        await cluster.wait_settled(control, timeout=30)

        async def two_leases_on() -> bool:
            return await cluster.client.now() - since > timedelta(seconds=2 * LEASE)

        await wait_until(two_leases_on, timeout=15, message="two leases after the restart")
        controls = {(row.scope, row.name): row for row in await cluster.client.flow_controls()}
        before_resume = await cluster.partitions()
        late = [call for call in handler.calls if call.partition_id.startswith("t-")
                and call.started > paused + PAUSE_GRACE]
        assert await cluster.client.resume_key("t") is True
        await cluster.wait_settled(layout, timeout=60)
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()

    t_calls = [call for call in handler.calls if call.partition_id.startswith("t-")]
    after_pause = [call.started - paused for call in t_calls[:at_pause] if call.started > paused]
    left = sum(info.counts.get("available", 0) for pid, info in before_resume.items()
               if pid.startswith("t-"))
    steps = {(call.partition_id, call.item_id, call.step) for call in t_calls}
    figures = (f"{at_pause} calls when paused; {len(after_pause)} started after the pause "
               f"(the last {max(after_pause, default=0):.3f} s after it); {left} items of t "
               f"left while paused; {len(t_calls)} calls of t for {len(steps)} steps "
               f"(repeats are at least once: a kill or a steal)")
    assert not late, f"{figures}; calls of t after the pause:\n" + "\n".join(
        f"  {call.partition_id}/{call.item_id} by {call.caller} at +{call.started - paused:.3f} s"
        for call in late[:10])
    assert left > 0, f"nothing of t was left to pause: {figures}"
    paused_key = controls.get(("key", "t"))
    assert paused_key is not None and paused_key.paused_at is not None, controls
    problems = item_problems(items, handler.calls, gates=1, passes=2) + handler.violations
    assert not problems, "\n".join([figures, *problems[:20]])
    print(f"\npause across a kill -9 of every processor: {figures}")


# -- 4. priority -----------------------------------------------------------------------

async def test_higher_priority_is_leased_first_across_processors(tmp_path) -> None:
    """3 processors of one lease each: three priority-10 partitions created after twelve
    of priority 0 are leased first; and three more, created while every processor is
    busy, are the next three leased, ahead of the eight low ones still waiting.

    (The starvation bound, 30 s of waiting per step of priority, is tested at the store
    with a fixed clock: tests/integration/test_pause_priority.py.)"""
    require_postgres()
    holding = asyncio.Event()
    holding.set()
    release = asyncio.Event()

    def hold(call: Call) -> asyncio.Event | None:
        return release if holding.is_set() and call.partition_id.startswith("lo-") else None

    handler = RecordingHandler(gates=1, passes=1, delay=0.05, hold=hold)
    async with Cluster(tmp_path, handler, name="fq") as cluster:
        first_high = {f"hi-{n}" for n in range(3)}
        second_high = {f"hi2-{n}" for n in range(3)}
        for n in range(12):
            await cluster.client.create_partition(
                f"lo-{n:02d}", [NewItem(f"i{m}", initial_data()) for m in range(3)])
        for pid in sorted(first_high):
            await cluster.client.create_partition(
                pid, [NewItem(f"i{m}", initial_data()) for m in range(3)], priority=10)
        procs = await cluster.start_many(3, "--max-leases", "1", "--concurrency", "2")
        # Every processor ends up holding one low partition, its calls held.
        await wait_until(lambda: len({call.caller for call in handler.in_flight()
                                      if call.partition_id.startswith("lo-")}) == 3,
                         timeout=30, message="every processor busy with a low partition")
        for pid in sorted(second_high):
            await cluster.client.create_partition(
                pid, [NewItem(f"i{m}", initial_data()) for m in range(3)], priority=10)
        leased_before = {pid for _, pid in leases_taken(proc.stderr() for proc in procs)}
        holding.clear()
        release.set()
        await cluster.wait_settled([*first_high, *second_high], timeout=30)
        taken = leases_taken(proc.stderr() for proc in procs)
        cluster.assert_no_tracebacks()

    order = [pid for pid, _ in sorted(first_calls(handler.calls).items(),
                                       key=lambda entry: entry[1].started)]
    later: list[str] = []
    for _, pid in taken:
        if pid not in leased_before and pid not in later:
            later.append(pid)
    figures = f"first calls in order: {order}; leased after the release: {later}"
    assert set(order[:3]) == first_high, figures
    assert set(later[:3]) == second_high, figures
    assert len(leased_before & {pid for pid in order if pid.startswith("lo-")}) == 3, figures
    print(f"\npriority across processors: {figures}")


# -- 5. delays -------------------------------------------------------------------------

LATE_SLACK = 0.25  # one poll is the bound; this is a read, a call's start and a busy host
SNOOZE = 1.0
LONG_SNOOZE = 2 * LEASE  # outlives the killed holder's lease: the next holder must wait


async def test_delays_are_never_early_and_at_most_a_poll_late(tmp_path) -> None:
    """Across 3 idle processors: items with ``not_before``, a partition with ``start_at``
    and items whose handler snoozes are never called before their time by the database
    clock, and at most one poll after it. Then a snooze whose holder is killed with
    ``kill -9`` is kept by the next holder (never early, at most a poll late: the
    failover fits in the snooze). A snooze uses up no attempt."""
    require_postgres()
    snoozes = {"z-0/i0": SNOOZE, "z-0/i1": SNOOZE, "z-1/i0": SNOOZE, "k-0/i0": LONG_SNOOZE}

    def respond(call: Call) -> tuple[int, object] | None:
        name = f"{call.partition_id}/{call.item_id}"
        if name in snoozes and not any(
                f"{other.partition_id}/{other.item_id}" == name
                for other in handler.calls[:call.seq]):
            return 200, {"snooze": snoozes[name]}
        return None

    handler = RecordingHandler(gates=1, passes=1, respond=respond)
    async with Cluster(tmp_path, handler, name="fd") as cluster:
        procs = await cluster.start_many(3)
        clock = await DbClock.read(cluster.client)
        now = clock.of(time.monotonic())
        due = {"d-0/later": now + timedelta(seconds=1.5),
               "d-1/later": now + timedelta(seconds=2.5), "s-0/i0": now + timedelta(seconds=2)}
        await cluster.client.create_partition("d-0", [
            NewItem("now", initial_data()),
            NewItem("later", initial_data(), not_before=due["d-0/later"])])
        await cluster.client.create_partition("d-1", [
            NewItem("later", initial_data(), not_before=due["d-1/later"])])
        await cluster.client.create_partition("s-0", [NewItem("i0", initial_data())],
                                              start_at=due["s-0/i0"])
        await cluster.client.create_partition("z-0", [NewItem("i0", initial_data()),
                                                      NewItem("i1", initial_data())])
        await cluster.client.create_partition("z-1", [NewItem("i0", initial_data())])
        idle = await snoozes_written(cluster, handler, clock, ["z-0/i0", "z-0/i1", "z-1/i0"])
        await cluster.wait_settled(["d-0", "d-1", "s-0", "z-0", "z-1"], timeout=30)

        # The long snooze: once it is written, its holder is killed.
        await cluster.client.create_partition("k-0", [NewItem("i0", initial_data())])
        failover = await snoozes_written(cluster, handler, clock, ["k-0/i0"])
        holder = (await cluster.client.partition("k-0")).owner
        next(proc for proc in procs if proc.owner == holder).kill()
        await cluster.wait_settled(["k-0"], timeout=30)
        items = {f"{info.partition_id}/{info.id}": info
                 for info in await cluster.items(["z-0", "z-1", "k-0"])}
        clock = await DbClock.read(cluster.client)
        cluster.assert_no_tracebacks()

    calls: dict[str, list[Call]] = defaultdict(list)
    for call in handler.calls:
        calls[f"{call.partition_id}/{call.item_id}"].append(call)
    problems: list[str] = []
    figures: list[str] = []
    for name, moment in [*due.items(), *idle.items(), *failover.items()]:
        call = calls[name][-1]
        after = clock.seconds_after(call.started, moment)
        figures.append(f"{name} {after:+.3f} s")
        if after < -clock.error:
            problems.append(f"{name}: called {-after:.3f} s before its time {moment}")
        elif after > POLL + LATE_SLACK:
            problems.append(f"{name}: called {after:.3f} s after its time, more than a poll")
    for name in snoozes:
        attempts = [call.attempt for call in calls[name]]
        if len(attempts) != 2 or attempts[0] != attempts[1]:
            problems.append(f"{name}: calls with attempts {attempts}; a snooze counts none")
        if items[name].attempts != 0 or items[name].status != "complete":
            problems.append(f"{name}: {items[name].status} after {items[name].attempts} "
                            "attempts")
    callers = [call.caller for call in calls["k-0/i0"]]
    assert callers[0] == holder and callers[-1] != holder, callers
    assert not problems, "\n".join([", ".join(figures), *problems])
    print(f"\ndelays (after their time, by the database clock): {', '.join(figures)}; "
          f"clock error ±{clock.error * 1000:.1f} ms")


async def snoozes_written(cluster: Cluster, handler: RecordingHandler, clock: DbClock,
                          names: Iterable[str]) -> dict[str, datetime]:
    """Wait until each item's snooze is written; returns its ``retry_at`` (aware UTC).

    Written: the item's ``retry_at`` is later than the handler's snooze answer, by the
    database clock (before it, ``retry_at`` is when the item became ready).

    Raises:
        AssertionError: not all of them within 15 s.
    """
    async def written() -> dict[str, datetime] | None:
        found: dict[str, datetime] = {}
        for name in names:
            partition_id, item_id = name.split("/")
            answered = [call.finished for call in handler.calls if call.finished is not None
                        and (call.partition_id, call.item_id) == (partition_id, item_id)]
            if not answered:
                return None
            retry_at = (await cluster.client.item(partition_id, item_id)).retry_at
            if retry_at is None or retry_at.replace(tzinfo=UTC) <= clock.of(answered[0]):
                return None
            found[name] = retry_at.replace(tzinfo=UTC)
        return found

    return await wait_until(written, timeout=15, message=f"the snoozes of {names} written")
