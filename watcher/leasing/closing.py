"""A holder's close that travels with its partition's last results.

When a supervisor queues what it takes to be its partition's last results at the gate,
it hands the result writer a :class:`CloseWithWrite`. The writer sends the close after
the batch's writes, in the same round trip (:meth:`~watcher.store.Store.
items_apply_closing`), guarded as any close is: by the lease's version and owner, and
by nothing being left to do. So a small partition's close costs no statement of its
own. When the guard says no (something is left, the lease moved), nothing is closed
and the supervisor moves its gate as before.

The writer holds the lease's lock while the close is sent, as every holder's write of
the partition row does; it takes the lock only if it is free at once (a renewal or a
move holds it: the close is not tried), so it never waits on a lease.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from watcher.leasing.lease import Lease
from watcher.records import ItemWrite, PartitionClose
from watcher.rules.decisions import completed_in_place
from watcher.rules.timeline import Progress, decode_timeline, encode_timeline, record_move
from watcher.store import Store


@dataclass(eq=False, slots=True)
class CloseWithWrite:
    """Close ``lease``'s partition at ``gate`` with the write of its last results.

    ``timeline`` is the timeline the close writes, with ``progress`` counted in it;
    ``failures_allowed`` is the partition's ``on_item_failure="continue"``.
    ``version`` is the partition's version after the close, once it closed;
    ``answered``: the writer has answered the writes it goes with (sent or not).
    """

    lease: Lease
    gate: int
    failures_allowed: bool
    timeline: str
    progress: Progress
    version: int | None = None
    answered: bool = False

    @property
    def closed(self) -> bool:
        """Whether the close was written."""
        return self.version is not None


@contextlib.asynccontextmanager
async def _held(requests: Sequence[CloseWithWrite]
                ) -> AsyncIterator[list[tuple[CloseWithWrite, PartitionClose]]]:
    """The requests that may be tried now, each with the close to send: its lease is
    open, still at the request's gate, and its lock was free (taken here, without
    waiting, and held until the block ends). A close that went through records the
    partition's new version on its lease before the lock is let go (:func:`_closed`).
    """
    held: list[CloseWithWrite] = []
    try:
        for request in requests:
            lease = request.lease
            if (lease.lock.locked() or lease.lost or lease.closed
                    or lease.gate != request.gate):
                continue
            await lease.lock.acquire()  # free: taken without waiting
            held.append(request)
        yield [(request, PartitionClose(request.lease.partition_id, request.lease.version,
                                        request.gate, request.failures_allowed,
                                        request.timeline))
               for request in held]
    finally:
        for request in held:
            request.lease.lock.release()


def _closed(request: CloseWithWrite, close: PartitionClose, went: bool) -> None:
    """``close`` (``request``'s) was sent, and ``went`` through: then the partition row
    is one version on, and the lease, whose lock the caller holds, says so. Refused,
    something was left to do: the drained gate reads its summary rather than try its
    close again (:attr:`~watcher.leasing.lease.Lease.may_close_at_once`)."""
    if went:
        request.version = close.version + 1
        request.lease.wrote(request.version)
    else:
        request.lease.close_refused = True


async def write_with_closes(store: Store, writes: Sequence[ItemWrite], owner: str,
                            requests: Sequence[CloseWithWrite]) -> list[bool]:
    """Write ``writes`` (``owner``'s results) in one transaction, with the closes that
    ``requests`` ask for, those that may be tried now (their lease open at the gate,
    its lock free); returns, per write, whether it was applied. A batch that fails
    sends its closes again when it is written again.

    Raises what :meth:`~watcher.store.Store.items_apply` raises (nothing is written,
    no partition closed).
    """
    async with _held(requests) as held:
        applied, went = await store.items_apply_closing(writes, owner,
                                                         [close for _, close in held])
        for (request, close), closed in zip(held, went, strict=True):
            _closed(request, close, closed)
    return applied


def close_request(lease: Lease, writes: Sequence[ItemWrite], unwritten: int,
                  now: datetime | None, at: float) -> CloseWithWrite | None:
    """The close to send with ``writes``, the results its holder takes to be the last
    at ``lease``'s gate (``unwritten`` results are queued in all, theirs included: the
    timeline counts them), or ``None`` when it is not to be tried: the drained gate would
    not try its close at once either (:attr:`~watcher.leasing.lease.Lease.
    may_close_at_once`), a write does not complete its item in place, the gate has a
    quorum, the lease is being handed over, or the store's time (``now``) is not known
    without a round trip. ``at`` is ``time.monotonic()``.
    """
    gate = lease.gate
    if (now is None or not lease.may_close_at_once or lease.handing_over
            or lease.settings.quorum_at(gate)
            or not completed_in_place(writes, [True] * len(writes), gate)):
        return None
    progress = Progress(gate, lease.done.items + unwritten, lease.done.age(at))
    timeline = encode_timeline(record_move(decode_timeline(lease.timeline), now, progress,
                                           None))
    return CloseWithWrite(lease, gate, lease.settings.continue_on_failure, timeline, progress)
