"""Fan-out/fan-in: P partitions x N items, a per-item step, then one reduce per partition.

Every system does the work of :mod:`bench.ranking` (the step scores an item;
the reduce sees every score of its partition and folds them into the count,
the sum and the top ten, and statefeed's also answers the top items with
their rank) and every result is checked. For each system the items exist
before the clock starts (item lists, chord signatures); the clock starts
before the first partition is created (or chord sent) and stops when the
last partition's reduce returned its answer. Partitions are created (chords
sent) one after another from this process, with the system already running
and warmed up by one small partition.

- statefeed, library mode: one in-process watcher at its defaults, the step
  and the reduce as in-process functions (``Watcher(store, step, reduce=...)``).
- statefeed, ``processor run``: at its defaults, calling a handler made with
  the SDK (:mod:`bench.chord_handler`: ``handlers.app(step, reduce=...)``) in
  its own uvicorn process.
- Celery: a chord per partition (N ``step`` tasks, the ``reduce`` task as its
  body; :mod:`bench.celery_app`), Redis as result backend, one worker per
  setup (prefork with 2 processes, threads, solo) and per broker (Redis, and
  RabbitMQ where it answers), started and stopped here, in a process group of
  its own so none of its children can be left behind. The best setup on
  either broker counts. Skipped, with a message, where Celery is not
  installed or no Redis answers (``$PROCESSOR_BENCH_REDIS_URL``, default
  ``redis://127.0.0.1:6379/0``); RabbitMQ's setups alone are skipped where
  it does not answer (``$PROCESSOR_BENCH_RABBITMQ_URL``, default
  ``amqp://guest:guest@127.0.0.1:5672//``).

Figures: steps/s (P x N items through step and reduce, divided by the time),
and the partition latency p50/p99, from the moment its creation (its chord's
sending) began to the moment its reduce returned (for library mode also to
its partition complete, its answers written). The goals' ratios:
statefeed library mode at its defaults against the best Celery setup.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from bench.celery_side import (
    STARTUP_TIMEOUT,
    STOP_TIMEOUT,
    CeleryClient,
    broker_title,
    brokers_available,
    celery_unavailable,
    celery_version,
    delete_queue,
    redis_url,
    setup_label,
    shown_url,
    start_worker,
    wait_result,
)
from bench.common import (
    Goal,
    Outcome,
    Row,
    Settings,
    best_round,
    ms_text,
    percentile,
    rate_text,
    ratio,
    ratio_goal,
    settle_heap,
    statefeed_tables,
    summary_ms,
    wait_for,
)
from bench.procs import Handler, Processes
from bench.ranking import LibraryRanker, check_result, item_id, library_step, number_data
from bench.reduce import FanInHooks
from processor import AsyncClient, NewItem
from watcher import Store, Watcher, WatcherConfig

TITLE = ("Fan-out/fan-in: P partitions x N items, a step then a reduce per partition "
         "(statefeed vs Celery chord on Redis and RabbitMQ)")
THROUGHPUT_GOAL = 10.0  # statefeed library at defaults / best Celery setup, at least
P99_GOAL = 0.2  # statefeed library p99 / best Celery p99, at most
WARMUP_ITEMS = 4
POLL = 0.02


@dataclass(frozen=True)
class ChordRun:
    """One system's run: the work, the time, and each partition's latency."""

    system: str
    partitions: int
    items: int  # in all
    seconds: float  # first creation began -> last reduce returned
    latencies: tuple[float, ...]  # per partition: creation began -> its reduce returned
    extra: dict[str, Any]
    rounds: tuple[float, ...] = ()  # steps/s of every round, when run more than once

    @property
    def per_second(self) -> float:
        """Items through step and reduce per second."""
        return self.items / self.seconds

    @property
    def p50(self) -> float:
        """Median partition latency, seconds."""
        return percentile(self.latencies, 50)

    @property
    def p99(self) -> float:
        """99th percentile partition latency, seconds."""
        return percentile(self.latencies, 99)

    def as_json(self) -> dict[str, Any]:
        """The run as a JSON object."""
        return {"system": self.system, "partitions": self.partitions, "items": self.items,
                "seconds": round(self.seconds, 4), "steps_per_s": round(self.per_second, 1),
                "rounds_steps_per_s": list(self.rounds),
                "partition_latency": summary_ms(self.latencies), **self.extra}

    def detail(self) -> str:
        """The line under the figure in the table."""
        return (f"{self.partitions} x {self.items // self.partitions:,} items in "
                f"{self.seconds:.2f} s; partition latency p50 {ms_text(self.p50)}, "
                f"p99 {ms_text(self.p99)}")


def _partition_ids(count: int) -> list[str]:
    return [f"p{number:05d}" for number in range(count)]


def _new_items(count: int) -> list[NewItem]:
    return [NewItem(item_id(number), number_data(number)) for number in range(count)]


async def _open_partitions(client: AsyncClient) -> int:
    partitions = client.store.tables.partitions
    async with client.store.engine.connect() as conn:
        return (await conn.execute(select(func.count()).where(
            partitions.c.status == "available"))).scalar_one()


# --------------------------------------------------------------------------- statefeed


async def statefeed_library(settings: Settings) -> ChordRun:
    """P partitions through one in-process watcher at its defaults.

    Raises:
        TimeoutError: not done within the phase timeout.
        RuntimeError: a partition did not complete, or its result is wrong.
    """
    sizes = settings.sizes
    ids = _partition_ids(sizes.chord_partitions)
    items = _new_items(sizes.chord_items)
    hooks = FanInHooks()
    ranker = LibraryRanker()
    created: dict[str, float] = {}
    async with statefeed_tables(settings.db_url, "chord") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            store = Store.open(settings.db_url, prefix)
            watcher = Watcher(store, library_step, WatcherConfig(owner_id="bench-chord"),
                              hooks, reduce=ranker)
            running = asyncio.create_task(watcher.run())
            try:
                for pid in ("warmup", *ids):
                    hooks.events[pid] = asyncio.Event()
                await client.create_partition("warmup", _new_items(WARMUP_ITEMS),
                                              reduce_gates=[1])
                async with asyncio.timeout(STARTUP_TIMEOUT):
                    await hooks.events["warmup"].wait()
                settle_heap()
                started = time.monotonic()
                for pid in ids:
                    created[pid] = time.monotonic()
                    await client.create_partition(pid, items, reduce_gates=[1])
                async with asyncio.timeout(sizes.phase_timeout):
                    await asyncio.gather(*(hooks.events[pid].wait() for pid in ids))
            finally:
                await watcher.stop()
                await running
                await store.close()
            for pid in ids:
                info = await client.partition(pid)
                if info.status != "complete":
                    raise RuntimeError(f"statefeed library: partition {pid} is {info.status}: "
                                       f"{info.last_error!r}")
                check_result(pid, info.result_json(), range(sizes.chord_items))
    answered = [ranker.answered[pid] for pid in ids]
    closed = [hooks.closed[pid][0] for pid in ids]
    return ChordRun(
        "statefeed library mode (1 watcher, defaults)", len(ids), len(ids) * len(items),
        max(answered) - started, tuple(ranker.answered[pid] - created[pid] for pid in ids),
        {"all_written_seconds": round(max(closed) - started, 4),
         "latency_to_complete": summary_ms([hooks.closed[pid][0] - created[pid]
                                            for pid in ids]),
         "reduce_calls": dict(ranker.calls)})


async def statefeed_http(settings: Settings, procs: Processes, handler: Handler) -> ChordRun:
    """P partitions through ``processor run`` (defaults) and the SDK handler.

    Raises:
        TimeoutError: not done within the phase timeout.
        RuntimeError: the processor exited, or a partition or result is wrong.
    """
    sizes = settings.sizes
    ids = _partition_ids(sizes.chord_partitions)
    items = _new_items(sizes.chord_items)
    created: dict[str, float] = {}
    async with statefeed_tables(settings.db_url, "chordhttp") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            child = await procs.processor("chord-processor", handler_url=f"{handler.url}/",
                                          db_url=settings.db_url, prefix=prefix)

            async def all_closed() -> bool:
                if not child.running:
                    raise RuntimeError(f"processor run exited ({child.process.returncode}):\n"
                                       f"{child.log()[-2000:]}")
                return await _open_partitions(client) == 0

            try:
                await client.create_partition("warmup", _new_items(WARMUP_ITEMS),
                                              reduce_gates=[1])
                await wait_for(all_closed, timeout=STARTUP_TIMEOUT, interval=POLL,
                               what="processor run to reduce a warm-up partition")
                started = time.monotonic()
                for pid in ids:
                    created[pid] = time.monotonic()
                    await client.create_partition(pid, items, reduce_gates=[1])
                await wait_for(all_closed, timeout=sizes.phase_timeout, interval=POLL,
                               what=f"processor run to reduce {len(ids)} partitions")
                written = time.monotonic()
            finally:
                await child.terminate()
            done_at: dict[str, float] = {}
            for pid in ids:
                info = await client.partition(pid)
                if info.status != "complete":
                    raise RuntimeError(f"processor run: partition {pid} is {info.status}: "
                                       f"{info.last_error!r}")
                result = info.result_json()
                check_result(pid, result, range(sizes.chord_items))
                done_at[pid] = result["done_at"]
    return ChordRun(
        "statefeed processor run (defaults) + SDK handler", len(ids), len(ids) * len(items),
        max(done_at.values()) - started, tuple(done_at[pid] - created[pid] for pid in ids),
        {"all_written_seconds": round(written - started, 4),
         "all_written_note": "polled every 20 ms"})


# --------------------------------------------------------------------------- Celery


def celery_chords(queue: str, broker: str, partitions: Sequence[str], items: int,
                  timeout: float, stopping: threading.Event
                  ) -> tuple[float, dict[str, float], dict[str, dict[str, Any]]]:
    """Send one chord per partition to ``queue`` through ``broker``, wait for every body's
    result, delete the results; returns the start, when each chord's sending began, and
    each result.

    Raises:
        TimeoutError: a result did not come within ``timeout`` s.
        RuntimeError: a result is wrong, or ``stopping`` was set.
    """
    from celery import chord

    from bench.celery_app import sender

    app = sender(broker)
    signatures = [chord([app.signature("bench.step", (number,), queue=queue)
                         for number in range(items)],
                        app.signature("bench.reduce", (pid,), queue=queue), app=app)
                  for pid in partitions]
    deadline = time.monotonic() + timeout
    created: dict[str, float] = {}
    sent = []
    settle_heap()
    started = time.monotonic()
    try:
        for pid, signature in zip(partitions, signatures, strict=True):
            if stopping.is_set():
                raise RuntimeError("the Celery client was stopped")
            created[pid] = time.monotonic()
            sent.append(signature.apply_async())
        values = {pid: wait_result(result, deadline, stopping)
                  for pid, result in zip(partitions, sent, strict=True)}
    finally:
        _forget(app, sent)
    for pid, value in values.items():
        check_result(pid, value, range(items))
    return started, created, values


def _forget(app: Any, sent: list[Any]) -> None:
    """Delete the chords' result keys (the body's, the steps', the group's) from Redis."""
    backend = app.backend
    keys: list[str] = []
    for result in sent:
        keys.append(backend.get_key_for_task(result.id))
        group = result.parent
        if group is not None:
            keys += [backend.get_key_for_group(group.id, suffix)
                     for suffix in ("", ".j", ".t", ".s", ".d", ".c")]
            keys += [backend.get_key_for_task(child.id) for child in group.results]
    client = backend.client
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start:start + 1000])


async def celery_runs(settings: Settings, procs: Processes, client: CeleryClient, setup: str,
                      broker: str) -> list[ChordRun]:
    """Start a worker of ``setup`` on ``broker``, warm it up, run the rounds, stop it
    (SIGTERM, a warm shutdown; kill -9 of its process group after :data:`STOP_TIMEOUT` s)
    and delete its queue.

    Raises:
        RuntimeError: the worker exited, or a result is wrong.
        TimeoutError: the worker did not answer in time.
    """
    sizes = settings.sizes
    _, _, label = setup_label(setup)
    queue = f"bench-chord-{uuid.uuid4().hex[:8]}"
    ids = _partition_ids(sizes.chord_partitions)
    worker = await start_worker(procs, setup, queue, broker)
    runs: list[ChordRun] = []

    async def chords(partitions: list[str], items: int, timeout: float  # noqa: ASYNC109
                     ) -> tuple[float, dict[str, float], dict[str, dict[str, Any]]]:
        work = asyncio.ensure_future(client.call(celery_chords, queue, broker, partitions,
                                                 items, timeout, client.stopping))
        try:
            while not work.done():  # fail fast if the worker dies
                await asyncio.wait([work], timeout=0.2)
                if not worker.running and not work.done():
                    raise RuntimeError(f"the Celery worker ({label}) exited "
                                       f"({worker.process.returncode}):\n{worker.log()[-2000:]}")
        except BaseException:
            client.stop()  # the thread gives up its wait; nothing else is sent
            # Its "stopped" error is expected: retrieved here, so it is not reported later.
            work.add_done_callback(lambda done: done.cancelled() or done.exception())
            raise
        return work.result()

    try:
        await chords(["warmup"], WARMUP_ITEMS, STARTUP_TIMEOUT)
        for _ in range(settings.rounds):
            started, created, values = await chords(ids, sizes.chord_items,
                                                    sizes.phase_timeout)
            runs.append(ChordRun(
                f"Celery chord ({label}, {broker_title(broker)})", len(ids),
                len(ids) * sizes.chord_items,
                max(value["done_at"] for value in values.values()) - started,
                tuple(values[pid]["done_at"] - created[pid] for pid in ids),
                {"setup": setup, "broker": broker, "queue": queue}))
    finally:
        code = await worker.terminate(STOP_TIMEOUT)
        await asyncio.to_thread(delete_queue, queue, broker)
    # 0 when the worker stopped by itself on SIGTERM (a warm shutdown), -9 when killed.
    return [dataclasses.replace(run, extra={**run.extra, "worker_exit_code": code})
            for run in runs]


# --------------------------------------------------------------------------- scenario


async def run(settings: Settings) -> Outcome:
    """The chord scenario (see the module docstring)."""
    sizes = settings.sizes
    outcome = Outcome("chord", TITLE)
    library = best_round([await statefeed_library(settings) for _ in range(settings.rounds)])
    celery_best: list[ChordRun] = []
    skipped = await asyncio.to_thread(celery_unavailable)
    brokers, brokers_skipped = await asyncio.to_thread(brokers_available)
    async with Processes(settings.work_dir) as procs:
        handler = await procs.handler("chord-handler", module="bench.chord_handler")
        http = best_round([await statefeed_http(settings, procs, handler)
                           for _ in range(settings.rounds)])
        if skipped is None:
            client = CeleryClient()
            try:
                for broker in brokers:
                    for setup in sizes.celery_setups:
                        celery_best.append(best_round(await celery_runs(
                            settings, procs, client, setup, broker)))
            finally:
                client.stop()
    # Each ratio against the Celery setup that did best on that figure.
    best = max(celery_best, key=lambda run: run.per_second, default=None)
    quickest = min(celery_best, key=lambda run: run.p99, default=None)
    throughput = ratio(library.per_second, best.per_second if best else None)
    p99_share = ratio(library.p99, quickest.p99 if quickest else None)
    outcome.rows.append(Row(library.system, rate_text(library.per_second, "steps/s"),
                            library.detail() + "; to partition complete p99 "
                            f"{library.extra['latency_to_complete']['p99_ms']:,.0f} ms"))
    outcome.rows.append(Row(http.system, rate_text(http.per_second, "steps/s"), http.detail()))
    version = celery_version() if skipped is None else ""
    for celery_run in celery_best:
        outcome.rows.append(Row(celery_run.system.replace("Celery", f"Celery {version}"),
                                rate_text(celery_run.per_second, "steps/s"),
                                celery_run.detail()))
    if skipped is not None:
        outcome.rows.append(Row("Celery chord", "skipped", skipped))
    else:
        for broker, why in brokers_skipped.items():
            outcome.rows.append(Row(f"Celery chord on {broker_title(broker)}", "skipped", why))
    if best is not None and quickest is not None and throughput is not None \
            and p99_share is not None:
        outcome.rows.append(Row("ratio statefeed library (defaults) / best Celery, steps/s",
                                f"{throughput:.2f}x", f"best: {best.system}"))
        outcome.rows.append(Row("ratio statefeed library p99 / best Celery p99",
                                f"{p99_share:.3f}x",
                                f"{ms_text(library.p99)} vs {ms_text(quickest.p99)} "
                                f"({quickest.system})"))
    outcome.figures = {
        "partitions": sizes.chord_partitions, "items_per_partition": sizes.chord_items,
        "statefeed_library": library.as_json(), "statefeed_http": http.as_json(),
        "celery": ({"skipped": skipped} if skipped is not None else
                   {"version": version, "redis": shown_url(redis_url()),
                    "brokers": brokers, "brokers_skipped": brokers_skipped,
                    "setups": [run.as_json() for run in celery_best]}),
        "ratio_library_over_best_celery": None if throughput is None else round(throughput, 3),
        "ratio_library_p99_over_best_celery_p99":
            None if p99_share is None else round(p99_share, 4),
    }
    outcome.goals.append(ratio_goal("chord: statefeed library (defaults) vs best Celery, "
                                    "steps/s", throughput, THROUGHPUT_GOAL))
    outcome.goals.append(Goal("chord: partition p99, statefeed library / best Celery",
                              f"<= {P99_GOAL:g}x",
                              "-" if p99_share is None else f"{p99_share:.3f}x",
                              None if p99_share is None else p99_share <= P99_GOAL))
    return outcome
