"""The watcher: one lease keeper, one result writer, and a supervisor per leased partition.

``run_once()`` runs one lease cycle and starts or drops supervisors; ``run()``
repeats it every poll interval (or at once on :meth:`Watcher.wake`) until
:meth:`Watcher.stop`. Stopping is graceful: no new leases, in-flight items
finish and are written, then every lease is released so another watcher takes
over at once. Cancelling the ``run()`` task instead is abrupt, like a crash:
leases are left to expire.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any, Literal

from sqlalchemy.exc import SQLAlchemyError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from watcher.config import WatcherConfig
from watcher.dispatch.backoff import backoff, last_error, sleep_until
from watcher.dispatch.context import PartitionContext
from watcher.dispatch.spans import find_tracer
from watcher.dispatch.supervisor import PartitionSupervisor
from watcher.dispatch.tracing import CallTracer, PartitionCalls
from watcher.dispatch.writer import ResultWriter
from watcher.flow.limits import FlowControl
from watcher.flow.slots import ReadAheadPool, SlotPool, wait_event
from watcher.hooks import Hooks, SafeHooks, overrides
from watcher.leasing.handover import grace as hand_over_grace
from watcher.leasing.keeper import LeaseCycle, LeaseKeeper
from watcher.leasing.lease import Lease
from watcher.leasing.listener import NotificationListener
from watcher.outages import OutageLatch
from watcher.pipelines import ServedPipelines, ServiceOfPlace, service_now
from watcher.protocol import (
    ProcessBatchCall,
    ProcessCall,
    Processor,
    ReduceCallable,
    ReduceShapeCall,
)
from watcher.rules.balance import Backlog, backlog_room
from watcher.store import Store
from watcher.store.drivers.conflicts import is_lock_conflict
from watcher.text import first_line

log = logging.getLogger(__name__)

# Longest wait between tries while the database fails.
DB_BACKOFF_MAX = 10.0


class Watcher:
    """Leases partitions from ``store`` and drives their items through ``processor``.

    ``processor`` is an object with ``async process(item)`` or such a coroutine
    function itself. A processor that also has ``async process_batch(items)``
    (:data:`~watcher.protocol.ProcessBatchCall`) gets each read's items in one call
    instead, answering a result or an exception per item. ``reduce`` (``async
    reduce(call) -> ReduceResult``) runs the partitions' reduce gates; by default
    the processor's own ``reduce`` method, if it has one (an
    :class:`~processor.http.processor.HttpProcessor` does). ``tracer``
    (:class:`~watcher.dispatch.tracing.CallTracer`) makes a span of every call; by default
    the processor's own, or OpenTelemetry's when the application set a tracer
    provider (:func:`~watcher.dispatch.spans.find_tracer`); ``None`` turns tracing off.
    A processor's ``async probe_handler() -> bool`` (an HttpProcessor has one) says
    whether its handler's service answers: asked while the calls are held for an
    outage (:mod:`watcher.flow.handler_hold`); without one, a hold ends after a short wait.
    """

    def __init__(self, store: Store, processor: Processor | ProcessCall,
                 config: WatcherConfig | None = None, hooks: Hooks | None = None, *,
                 reduce: ReduceCallable | None = None,
                 tracer: CallTracer | Literal["auto"] | None = "auto") -> None:
        self.store = store
        self.config = config or WatcherConfig()
        self.hooks: Any = SafeHooks(hooks or Hooks())
        process = getattr(processor, "process", processor)
        if not callable(process):
            raise TypeError("processor must have an async process(item) method or be one")
        self._process: ProcessCall = process
        self._process_batch: ProcessBatchCall | None = getattr(processor, "process_batch", None)
        if self._process_batch is not None and not callable(self._process_batch):
            raise TypeError("process_batch must be an async function taking a list of items")
        # The reduce of reduce gates: given, or the processor's own (an HttpProcessor's).
        self._reduce: ReduceCallable | None = reduce or getattr(processor, "reduce", None)
        if self._reduce is not None and not callable(self._reduce):
            raise TypeError("reduce must be an async function taking a ReduceCall")
        # What the processor's own reduce says it takes (an HttpProcessor asks its handler).
        self._reduce_shape: ReduceShapeCall | None = (
            getattr(processor, "reduce_shape", None) if reduce is None else None)
        # Decided once: with no tracer, the calls are the processor's own.
        self._tracer = find_tracer(processor) if tracer == "auto" else tracer
        self.slots = SlotPool(self.config.concurrency, on_calls=(
            self.hooks.in_flight if overrides(self.hooks, "in_flight") else None),
            on_turn=self._room_may_have_opened)
        self.keeper = LeaseKeeper(store, self.config, self.hooks, backlog=self._backlog)
        # A queued result frees its slot while the buffer has room, else once written.
        batch, buffered = self.config.result_batch, self.config.result_buffer
        self.writer = ResultWriter(
            store, self.config.owner_id, batch_size=batch if buffered else min(
                batch, self.config.concurrency),
            linger=self.config.result_linger, calls_running=lambda: self.slots.calls,
            buffer_items=buffered, buffer_bytes=self.config.result_buffer_bytes)
        self.read_ahead = ReadAheadPool(self.config.concurrency)
        # The processor's probe of its handler's service (an HttpProcessor's), which ends
        # the hold on calls while the service is down (watcher.flow.handler_hold).
        self.flow = FlowControl(store, self.config, self.hooks,
                                probe=getattr(processor, "probe_handler", None),
                                service_probe=getattr(processor, "probe_service", None))
        # A routing processor names each place's service: holds are per service then.
        self._service_of: ServiceOfPlace | None = getattr(processor, "service_of", None)
        self.supervisors: dict[str, tuple[PartitionSupervisor, asyncio.Task[str]]] = {}
        self._handing: set[asyncio.Task[None]] = set()  # hand-overs under way
        self._wake = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()
        self._running = False
        self._db_outage = OutageLatch()

    @property
    def owner(self) -> str:  # this watcher's owner id
        return self.config.owner_id

    @property
    def partitions(self) -> list[str]:  # the partitions this watcher holds leases on
        return sorted(self.keeper.leases)

    def serve(self, pipelines: ServedPipelines) -> None:
        """Lease only at the places ``pipelines`` serves from the next lease cycle on (a
        routes file reloaded); held partitions elsewhere are handed over then."""
        self.config = self.keeper.config = replace(self.config, pipelines=pipelines)

    def wake(self) -> None:  # run the next lease cycle now, not at the end of the poll
        self._wake.set()

    async def run_once(self) -> LeaseCycle:
        """One lease cycle; starts supervisors for new leases and reaps finished ones.

        Raises the database's error when it fails.
        """
        self.writer.start()
        if not self._running:  # driven by run_once alone: no flow loop reads the holds
            await self.flow.learn(self._held_keys)
        cycle = await self.keeper.run_once(acquire=not self._stopping)
        self._reap()
        if not self._stopping:
            for partition_id in cycle.handing_over:
                lease = self.keeper.leases.get(partition_id)
                if lease is not None:
                    task = asyncio.create_task(self._hand_over(lease),
                                               name=f"hand-over-{partition_id}")
                    self._handing.add(task)
                    task.add_done_callback(self._handing.discard)
            for lease in list(self.keeper.leases.values()):
                if lease.partition_id not in self.supervisors and not lease.handing_over:
                    self._start_supervisor(lease)
        return cycle

    async def _hand_over(self, lease: Lease) -> None:
        """Hand ``lease`` over to a processor that asked (:mod:`watcher.leasing.handover`), as a
        graceful stop does: no new call on it, the calls in flight end and are written (up
        to :func:`watcher.leasing.handover.grace`), then it is released, or kept if that fails."""
        grace = hand_over_grace(self.config)
        entry = self.supervisors.get(lease.partition_id)
        if entry is not None:
            supervisor, task = entry
            await supervisor.drain(grace)
            await asyncio.wait([task], timeout=grace)
        if lease.lost or lease.closed:
            return
        try:
            if await self.keeper.release(lease, reason="handed_over"):
                self.hooks.lease_handed_over(lease.partition_id)
        except SQLAlchemyError as error:
            lease.handing_over = False  # still held and renewed: dispatch it again
            log.warning("action=hand_over_release_failed partition=%s pipeline=%s owner=%s "
                        "error=%s; kept and dispatched again", lease.partition_id,
                        lease.settings.pipeline, self.owner, type(error).__name__)

    def _start_supervisor(self, lease: Lease) -> None:
        context = PartitionContext(lease, self.store, self.keeper, self.config, self.hooks)
        service = service_now(self._service_of, lease.settings, lambda: lease.gate)
        on_throttled, on_unavailable = self.flow.holds_of(service)
        supervisor = PartitionSupervisor(
            context, PartitionCalls(self._process, self._process_batch, self._reduce),
            writer=self.writer, slots=self.flow.slots_for(lease.settings, self.slots, service),
            reduce_shape=self._reduce_shape, tracer=self._tracer,
            on_throttled=on_throttled, on_unavailable=on_unavailable, read_ahead=self.read_ahead)
        task = asyncio.create_task(supervisor.run(), name=f"partition-{lease.partition_id}")
        task.add_done_callback(lambda _: self._room_may_have_opened())
        self.supervisors[lease.partition_id] = (supervisor, task)

    def _room_may_have_opened(self) -> None:
        """A partition that closed (or was lost), or got its turn at the slots (the backlog
        shrank), frees room for another: look at once when that can start work sooner.
        Not when the last lease cycle saw no free partition it left untaken (the next
        poll, or a client's notification, finds new ones), nor until the cycle could take
        a lease batch, or all the room ``max_leases`` leaves if that is less: while the
        slots' backlog is full, the held partitions keep every slot busy, and the cycle
        waits to take a fuller batch. An ended supervisor is reaped then."""
        keeper = self.keeper
        if not keeper.free_left:
            return
        open_room = keeper.open_room()
        if open_room > 0 and open_room >= min(self.config.lease_batch, keeper.room):
            self._wake.set()

    def _backlog(self) -> Backlog:
        """The held partitions waiting for a turn at the slots, for the lease keeper; the
        last one's place and the keys held only when the backlog is full (only then
        does the keeper ask which free partitions would go ahead of it)."""
        backlog = Backlog(self.slots.waiting)
        if backlog_room(backlog, self.config.lease_batch) > 0:
            return backlog
        return Backlog(backlog.waiting, self.slots.last_waiting_order(),
                       frozenset(self._held_keys()))

    def _reap(self) -> None:
        for partition_id, (supervisor, task) in list(self.supervisors.items()):
            if not task.done():
                continue
            del self.supervisors[partition_id]
            if task.cancelled():
                continue
            error = task.exception()
            if error is not None:
                log.error("action=supervisor_crashed partition=%s pipeline=%s error=%r",
                          partition_id, supervisor.reports.pipeline, error, exc_info=error)

    async def run(self) -> None:
        """Lease and dispatch until :meth:`stop`; then shut down gracefully."""
        if self._running:
            raise RuntimeError("this watcher is already running")
        self._running = True
        log.info("action=watcher_started owner=%s", self.owner)
        if self.store.polling_reason is not None:
            log.info("action=listen_off owner=%s reason=%r; polling every %s s instead",
                     self.owner, self.store.polling_reason, self.config.poll_interval)
        listener = (asyncio.create_task(NotificationListener(
            self.store, self.on_notification, owner=self.owner,
            poll_interval=self.config.poll_interval, stopping=lambda: self._stopping,
        ).run(), name="listen") if self.store.notifies else None)
        flow = asyncio.create_task(self.flow.run(self._held_keys), name="flow-control")
        try:
            while not self._stopping:
                cycle = await self._lease_cycle()
                if cycle is None or self._stopping:
                    break
                delay = self.config.poll_interval
                if len(cycle.acquired) >= self.config.lease_batch:
                    delay = 0  # a full batch taken: more may be free, take them now
                await wait_event(self._wake, delay)
            await self._shutdown()
        except asyncio.CancelledError:
            await self._abort()
            raise
        finally:
            await self.flow.stop(flow)
            if listener is not None:
                listener.cancel()
                await asyncio.gather(listener, return_exceptions=True)
            self._running = False
            self._stopped.set()

    async def _lease_cycle(self) -> LeaseCycle | None:
        """:meth:`run_once`, tried again with backoff while the database fails.

        A lock conflict is tried again after a poll interval and logged at
        debug level; an outage is logged when it begins and when it ends. A
        wake-up (:meth:`wake`, :meth:`stop`) cuts a wait short. Returns
        ``None`` when the watcher is stopping.

        Raises what :meth:`run_once` raises, other than a database error.
        """
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(SQLAlchemyError),
            wait=backoff(first=2 * self.config.poll_interval, maximum=DB_BACKOFF_MAX,
                         conflict=self.config.poll_interval),
            sleep=sleep_until(self._wake), before_sleep=self._database_failed)
        async for attempt in retrying:
            with attempt:
                if self._stopping:
                    return None
                self._wake.clear()
                cycle = await self.run_once()
        if self._db_outage.recover():
            log.warning("action=database_recovered owner=%s", self.owner)
        return cycle

    def _database_failed(self, state: RetryCallState) -> None:
        """Log a failed lease cycle: a conflict at debug level, an outage once."""
        error = last_error(state)
        if error is None:
            return
        if is_lock_conflict(error):
            log.debug("action=lease_cycle_conflict owner=%s", self.owner)
        elif self._db_outage.fail():
            log.warning("action=database_unavailable owner=%s error=%s detail=%s", self.owner,
                        type(error).__name__, first_line(error))

    def on_notification(self, partition_id: str) -> None:
        """A client wrote ``partition_id``: wake its supervisor, or look for free work."""
        lease = self.keeper.leases.get(partition_id)
        if lease is not None:
            lease.notify()
        else:
            self._wake.set()

    def _held_keys(self) -> set[str]:
        """The concurrency keys of the partitions held now."""
        return {lease.settings.key for lease in self.keeper.leases.values()
                if lease.settings.key}

    async def stop(self) -> None:
        """Stop gracefully and wait until done. Safe to call more than once."""
        self._stopping = True
        for supervisor, _ in self.supervisors.values():  # no new call or gate step from now
            supervisor.draining = True
        self._wake.set()
        if self._running:
            await self._stopped.wait()

    async def _shutdown(self) -> None:
        grace = self.config.shutdown_timeout
        for handing in list(self._handing):  # the shutdown drains and releases them all
            handing.cancel()
        supervisors = [supervisor for supervisor, _ in self.supervisors.values()]
        if supervisors:
            await asyncio.gather(*(s.drain(grace) for s in supervisors))
        tasks = [task for _, task in self.supervisors.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        await self.writer.close(grace)
        for task in tasks:
            task.cancel()
        self._reap()
        try:
            await self.keeper.release_all()
        except SQLAlchemyError as error:
            log.warning("action=lease_release_failed owner=%s error=%s; leases expire in %s s",
                        self.owner, type(error).__name__, self.config.lease_duration)
        await self.flow.release()
        log.info("action=watcher_stopped owner=%s", self.owner)

    async def _abort(self) -> None:
        tasks = [task for _, task in self.supervisors.values()] + list(self._handing)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.supervisors.clear()
        await self.writer.close(0)
