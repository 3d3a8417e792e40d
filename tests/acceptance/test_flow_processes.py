"""Flow control across real ``processor run`` processes: a key's in-flight
limit through ``kill -9`` and rebalancing, fair queuing across keys, and a pause that
outlives every processor (priority and delays: ``test_flow_order_processes.py``).

The key never reaches the handler; each partition's id is ``<key>-<n>``, so the
handler derives the key from the ``X-Partition-Id`` header
(:func:`~tests.acceptance.harness.flow.key_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from processor import NewItem
from processor.client.checks import check_settings
from tests.acceptance.harness.checks import item_problems
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.flow import (
    KeyLoad,
    first_calls,
    leases_taken,
    log_time,
    most_at_once,
)
from tests.acceptance.harness.handler import Call, RecordingHandler, initial_data
from tests.acceptance.harness.processes import LEASE, POLL
from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.engine import create_one_item_partitions, wait_until
from watcher.store.sql.schema import tables_for

pytestmark = pytest.mark.timeout(120)

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


@pytest.mark.parametrize(("spans", "window", "most"), [
    ([], (0, 10), 0),
    ([(0, 1), (1, 2), (2, 3)], (0, 10), 1),  # back to back: never two at once
    ([(0, 2), (1, 3), (1.5, None)], (0, 10), 3),  # None: still running
    ([(0, 2), (1, 3), (1.5, None)], (2.5, 10), 2),
    ([(0, 2), (1, 3)], (3, 10), 0),
    ([(0, 5), (1, 2), (3, 4)], (0, 10), 2),
])
def test_most_at_once_counts_overlapping_calls(
        spans: list[tuple[float, float | None]], window: tuple[float, float], most: int) -> None:
    assert most_at_once(spans, *window) == most


@pytest.mark.postgres
@pytest.mark.timeout(180)  # five processes started one after another on a busy host
async def test_a_key_limit_holds_at_cold_start_through_kill_9_and_rebalancing(
        tmp_path) -> None:
    """Key ``a`` (8 partitions) has a fleet-wide limit of 4; key ``b`` has none.
    3 processors start cold, one is killed with ``kill -9`` while its calls of ``a``
    run on in the handler (for most of a lease) and is restarted under the same
    owner id, then a fourth joins and takes partitions over. The handler never sees
    more than 4 calls of ``a`` at once, in any phase."""
    require_postgres()
    rng = random.Random(26)
    hold = [0.1, 0.3]  # how long each call works, at random between the two
    load = KeyLoad(lambda call: rng.uniform(*hold))
    handler = RecordingHandler(gates=1, passes=1, hold=load)
    phases: dict[str, tuple[float, float]] = {}

    def ended(key: str, caller: str | None = None, after: float = 0.0) -> int:
        return sum(1 for span in load.of(key) if span.ended is not None
                   and span.started > after and (caller is None or span.caller == caller))

    def busy() -> str | None:
        running = [span.caller for span in load.of("a") if span.ended is None]
        return max(set(running), key=running.count) if running else None

    async with Cluster(tmp_path, handler, name="fk") as cluster, \
            sampling_grants(cluster, "a") as grants:
        # Enough of a's work that some is left when the fourth processor joins: at the
        # limit of 4 calls of 0.1-0.3 s, 480 calls take about 25 s. Once the fourth has
        # its share, the rest are quick calls (still under the limit, checked at the end).
        layout = await create_keyed(cluster, "a", 8, 60)
        layout |= await create_keyed(cluster, "b", 3, 20)
        await cluster.client.set_key_limit("a", LIMIT)
        began = time.monotonic()
        procs = await cluster.start_many(3)
        await wait_until(lambda: ended("a") >= 30, timeout=30, message="30 calls of a")
        phases["cold start"] = (began, time.monotonic())

        # The victim: the processor with the most calls of a running now.
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
        phases["kill -9 and restart"] = (killed_at, time.monotonic())

        joiner = await cluster.start(None)
        await joiner.wait_log("action=watcher_started")
        joined_at = time.monotonic()

        async def took_over() -> bool:
            held = (await cluster.live_owners()).get(joiner.owner, [])
            return bool(held) and ended("a", joiner.owner, joined_at) >= 3

        await wait_until(took_over, timeout=30, message="the fourth processor's share")
        phases["rebalancing"] = (joined_at, time.monotonic())
        # Checked before waiting for the rest, so a stall cannot hide it.
        problem = limit_problem(load, handler.calls, grants, phases)
        assert problem is None, (f"{problem}\nkilled at {killed_at:.3f}, restarted at "
                                 f"{restarted_at:.3f}, fourth joined at {joined_at:.3f}")
        hold[:] = [0.01, 0.03]
        await cluster.wait_settled(layout, timeout=60)
        items = await cluster.items(layout)
        cluster.assert_no_tracebacks()
        await load.close()

    phases["whole run"] = (began, time.monotonic())
    problem = limit_problem(load, handler.calls, grants, phases)
    assert problem is None, problem
    most = {name: load.most("a", *window) for name, window in phases.items()}
    figures = (f"most calls of a at once: {most}; of b: {load.most('b')}; {lingering} calls "
               f"of the killed processor ran on; {len(handler.calls)} calls")
    assert lingering >= 1, f"the victim had no call of a in flight: {figures}"
    assert most["whole run"] >= LIMIT - 1, f"the limit was never used: {figures}"
    assert load.most("b") > LIMIT, f"key b was held to a's limit: {figures}"
    problems = item_problems(items, handler.calls, gates=1, passes=1) + handler.violations
    assert not problems, "\n".join(problems[:20])
    print(f"\nkey limit {LIMIT} across 3+1 processors: {figures}")


Grants = list[tuple[float, list[tuple[str, int, int, float]]]]


def limit_problem(load: KeyLoad, calls: list[Call], grants: Grants,
                  phases: dict[str, tuple[float, float]]) -> str | None:
    """Why key ``a``'s limit did not hold in some phase (the calls that ran at once, with
    what became of them at the processor, and the grants sampled in the 1.5 s before),
    or ``None`` when it held."""
    most = {name: load.most("a", *window) for name, window in phases.items()}
    if all(count <= LIMIT for count in most.values()):
        return None
    crowd = load.crowd("a", min(start for start, _ in phases.values()),
                       max(end for _, end in phases.values()))
    moment = max(span.started for span in crowd)
    return "\n".join([
        f"most calls of a at once, by phase: {most}; the calls running at once:",
        *(f"  {span} {calls[span.seq].outcome}" for span in crowd),
        "a's grants (owner, slots, wanted, seconds left by the database clock) before:",
        *(f"  {at:.3f}: {rows}" for at, rows in grants if moment - 1.5 < at < moment + 0.2)])


@contextlib.asynccontextmanager
async def sampling_grants(cluster: Cluster, key: str) -> AsyncIterator[Grants]:
    """Sample ``key``'s grants every 50 ms while the block runs: the evidence if its
    limit is exceeded."""
    samples: Grants = []
    task = asyncio.create_task(sample_grants(cluster, key, samples))
    try:
        yield samples
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def sample_grants(cluster: Cluster, key: str,
                        samples: Grants) -> None:
    """Append ``key``'s grants (owner, slots, wanted, seconds left by the database clock)
    to ``samples`` every 50 ms, until cancelled."""
    grants = tables_for(cluster.prefix).flow_grants.name
    while True:
        rows = await cluster.db.query(
            f"SELECT owner, slots, wanted, extract(epoch FROM until - now() AT TIME ZONE 'UTC') "
            f"FROM {grants} WHERE scope = 'key' AND name = :key ORDER BY owner", key=key)
        samples.append((time.monotonic(), [(owner, slots, wanted, round(float(left), 3))
                                           for owner, slots, wanted, left in rows]))
        await asyncio.sleep(0.05)


# -- 2. fair queuing across keys -------------------------------------------------------

BURST = 2000


@pytest.mark.parametrize("database", [pytest.param("postgres", marks=pytest.mark.postgres),
                                      "sqlite"])
async def test_one_tenants_partition_starts_within_a_lease_cycle_behind_anothers_burst(
        tmp_path, database: str) -> None:
    """Tenant ``a`` has 2,000 one-item partitions and 3 processors are busy with them
    (50 leases and 4 calls each); tenant ``b``'s single partition, created then, is
    leased within one lease cycle (a third of the lease) of its insert, and called
    before half of a's burst has started."""
    sqlite_url = None if database == "postgres" else f"sqlite:///{tmp_path / 'statefeed.db'}"
    if sqlite_url is None:
        require_postgres()
    handler = RecordingHandler(gates=1, passes=1, delay=0.2)
    async with Cluster(tmp_path, handler, name="ff", db_url=sqlite_url or POSTGRES_URL
                       ) as cluster:
        await create_burst(cluster, "a", BURST)
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
               f"{len(started_before)} of {BURST}; a lease cycle is {RENEW:.3f} s")
    # The lease is the promise (taken at the next lease cycle, which starts within RENEW
    # and then reads and takes: half a cycle bounds that work on a loaded machine; a b
    # queued behind a's 2,000 partitions would wait dozens of cycles); the call follows
    # at the holder's next free slot, a figure printed here and measured by
    # `bench --only flow`.
    assert leased[0] - inserted_wall < RENEW * 1.5, figures
    assert len(started_before) < BURST // 2, f"a's burst was not waiting: {figures}"
    print(f"\nfairness, {figures}")


async def create_burst(cluster: Cluster, key: str, count: int) -> None:
    """Create ``count`` one-item partitions ``<key>-<nnnn>`` of ``key``, in order (in one
    transaction: a commit per partition made this most of the test's time)."""
    await create_one_item_partitions(
        cluster.client.store, [f"{key}-{n:04d}" for n in range(count)],
        check_settings("p", (), "fail", 0, key), initial_data())


# -- 3. a pause outlives every processor -----------------------------------------------

PAUSE_GRACE = POLL + 0.2  # one poll, and the calls a read in progress had started


@pytest.mark.postgres
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
