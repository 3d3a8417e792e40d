"""Bounding each database round trip, and remembering which kinds time out.

A connection that stops answering (a failover behind a pooler, a half-open TCP
connection, a statement waiting on a lock) would otherwise hold a statement,
and the loop waiting on it, for minutes. Two bounds apply:

- the server's own: each database ends a statement that runs (or waits on a
  lock) longer than the timeout, and the connection stays usable (set per
  connection by :mod:`watcher.store.db.engine` and the direct paths);
- the client's: :class:`RoundTrips` gives up on a round trip that got no
  answer within the timeout plus :data:`CLIENT_MARGIN`; the connection is
  discarded (the database driver invalidates a connection interrupted mid-
  statement).

Either way the caller gets a :class:`sqlalchemy.exc.SQLAlchemyError`, so the
loops' outage handling retries it. The first timeout logs one WARNING line;
``/readyz`` reads :meth:`RoundTrips.problem` and answers 503 until that kind of
round trip succeeds again.

A caller cancelled during a round trip gets :class:`asyncio.CancelledError`, even
when the driver's clean-up of the interrupted statement raised a database error
in its place (a rollback on a connection left mid-statement fails): passed on as
a database error, the cancellation would be lost, and a loop that retries
database errors would carry on as if it had never been asked to stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger(__name__)

T = TypeVar("T")

# The client waits this much longer than the server's statement timeout, so that
# the server ends a slow statement first and the connection is kept.
CLIENT_MARGIN = 0.5
# After the first cancellation, a driver may try to cancel the statement on the
# server before giving up (psycopg waits up to 10 s for that); past this grace
# the round trip is interrupted again, which makes it drop the connection.
CANCEL_GRACE = 1.0
# A kind of round trip that timed out counts as failing until it succeeds again,
# or, if it is not tried again, until this long after its last timeout: longer
# than the loops' longest wait between tries (watcher.watcher.DB_BACKOFF_MAX).
FORGET_AFTER = 10.0
# Key of the running round trip's deadline in a pooled connection's ``info``.
DEADLINE_KEY = "statefeed_deadline"
SHOWN_STATEMENT_CHARS = 80


class _DeadlineCancellations(logging.Filter):
    """Drops psycopg's WARNINGs about a statement it was interrupted in: the deadline
    interrupts it on purpose, and logs its own one line for the outage."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(("query cancellation",
                                                    "query not terminated"))


DEADLINE_CANCELLATIONS = _DeadlineCancellations()


class DatabaseTimeoutError(OperationalError):
    """A database round trip got no answer within the database timeout.

    The connection it ran on was discarded; what it wrote, if anything, is
    unknown until read again (every statefeed write is guarded, so sending it
    again is safe).
    """

    def __init__(self, what: str, seconds: float, statement: str | None = None) -> None:
        super().__init__(statement, None, TimeoutError(
            f"no answer from the database within {seconds:g} s ({what}); the connection "
            "was dropped"), hide_parameters=True)
        self.what = what


class Deadline:
    """Cancels the current task when a round trip has run for ``seconds``, and again
    every :data:`CANCEL_GRACE` s until it stops; :meth:`push` starts the clock over
    (the next statement of a transaction).

    Used as ``async with``; on expiry the block raises :class:`TimeoutError`.
    """

    __slots__ = ("_cancels", "_entered_cancelling", "_handle", "_loop", "_seconds", "_task",
                 "statement")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[Any] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._cancels = 0
        self._entered_cancelling = 0
        self.statement: str | None = None

    async def __aenter__(self) -> Deadline:
        self._task = asyncio.current_task()
        assert self._task is not None, "a Deadline runs inside a task"
        self._entered_cancelling = self._task.cancelling()
        self._handle = self._loop.call_later(self._seconds, self._expire)
        return self

    def push(self, statement: str | None = None) -> None:
        """A new statement starts: it gets the whole time again (unless expired)."""
        self.statement = statement
        if self._cancels == 0 and self._handle is not None:
            self._handle.cancel()
            self._handle = self._loop.call_later(self._seconds, self._expire)

    def _expire(self) -> None:
        assert self._task is not None
        self._cancels += 1
        self._task.cancel()
        self._handle = self._loop.call_later(CANCEL_GRACE, self._expire)

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self._cancels:
            return
        assert self._task is not None
        for _ in range(self._cancels):
            self._task.uncancel()
        if self._task.cancelling() <= self._entered_cancelling and kind is not None and (
                issubclass(kind, asyncio.CancelledError) or issubclass(kind, SQLAlchemyError)):
            raise TimeoutError from error


class _Cancels:
    """The running task's pending cancellations when a round trip begins, to tell
    whether someone cancelled it during the round trip."""

    __slots__ = ("_before", "_task")

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self._before = 0 if self._task is None else self._task.cancelling()

    def raise_if_cancelled(self, error: BaseException) -> None:
        """Raise :class:`asyncio.CancelledError` (from ``error``) when the task was
        cancelled since; the database error raised in its place is then only the
        driver's clean-up failing. (A :class:`Deadline` takes back its own
        cancellations before this is asked.)

        Raises:
            asyncio.CancelledError: the task was cancelled during the round trip.
        """
        if self._task is not None and self._task.cancelling() > self._before:
            raise asyncio.CancelledError() from error


class RoundTrips:
    """Bounds a store's database round trips and remembers which kinds time out.

    ``timeout`` is the server's statement timeout; ``bound`` how long the client
    waits for an answer (``None``: the database bounds its own waits, as SQLite's
    busy timeout does, and nothing is interrupted). ``timed_out(error)`` says
    whether a database error is the server's own timeout (a statement or lock
    wait timeout). ``database`` names the database in log lines (redacted).
    ``precheck`` runs before each transaction and raises to refuse it.
    """

    def __init__(self, *, timeout: float, bound: float | None,
                 timed_out: Callable[[BaseException], bool], database: str,
                 precheck: Callable[[], None] | None = None) -> None:
        self.timeout = timeout
        self._precheck = precheck
        self.bound = bound
        self._server_timed_out = timed_out
        self.database = database
        # Kind of round trip -> time.monotonic() of its last timeout, while failing.
        self._failing: dict[str, float] = {}
        if bound is not None:
            logging.getLogger("psycopg").addFilter(DEADLINE_CANCELLATIONS)  # once only

    def watch(self, engine: AsyncEngine) -> None:
        """Start each statement of ``engine``'s transactions with a fresh deadline."""
        if self.bound is None:
            return

        @event.listens_for(engine.sync_engine, "before_cursor_execute")
        def _statement(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            deadline = conn.info.get(DEADLINE_KEY)
            if deadline is not None:
                deadline.push(statement)

    # -- bounding -------------------------------------------------------------

    async def call(self, what: str, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``, one round trip named ``what``, within the bound.

        Raises:
            DatabaseTimeoutError: no answer within the bound (the connection is dropped).
            sqlalchemy.exc.SQLAlchemyError: the database failed or refused it
                (its own timeout included, which is recorded too).
        """
        cancels = _Cancels()
        try:
            if self.bound is None:
                result = await awaitable
            else:
                async with Deadline(self.bound):
                    result = await awaitable
        except TimeoutError:
            raise self._client_timeout(what, None) from None
        except SQLAlchemyError as error:
            cancels.raise_if_cancelled(error)
            self._failed(what, error)
            raise
        if self._failing:
            self._succeeded(what)
        return result

    @asynccontextmanager
    async def transaction(self, opening: AbstractAsyncContextManager[AsyncConnection],
                          what: str) -> AsyncIterator[AsyncConnection]:
        """The transaction ``opening`` makes, each of its statements within the bound.

        Raises as :meth:`call` does, and what ``precheck`` raises.
        """
        if self._precheck is not None:
            self._precheck()
        cancels = _Cancels()
        if self.bound is None:
            try:
                async with opening as conn:
                    yield conn
            except SQLAlchemyError as error:
                cancels.raise_if_cancelled(error)
                self._failed(what, error)
                raise
        else:
            deadline = Deadline(self.bound)
            try:
                async with deadline, opening as conn:
                    # Kept, not read again at the end: a connection lost mid-transaction
                    # refuses every read (PendingRollbackError) until rolled back, and
                    # that error would hide the loss from the caller.
                    info = conn.info
                    info[DEADLINE_KEY] = deadline
                    try:
                        yield conn
                    finally:
                        info.pop(DEADLINE_KEY, None)
            except TimeoutError:
                raise self._client_timeout(what, deadline.statement) from None
            except SQLAlchemyError as error:
                cancels.raise_if_cancelled(error)
                self._failed(what, error)
                raise
        if self._failing:
            self._succeeded(what)

    # -- what happened ----------------------------------------------------------

    def _client_timeout(self, what: str, statement: str | None) -> DatabaseTimeoutError:
        assert self.bound is not None
        self._record(what, statement)
        return DatabaseTimeoutError(what, self.bound, statement)

    def _failed(self, what: str, error: SQLAlchemyError) -> None:
        if self._server_timed_out(error):
            self._record(what, getattr(error, "statement", None))

    def _record(self, what: str, statement: str | None) -> None:
        if not self._failing:
            shown = " ".join((statement or "").split())[:SHOWN_STATEMENT_CHARS]
            log.warning("action=database_timeout what=%s seconds=%g database=%s%s; "
                        "the connection is dropped and the work tried again", what,
                        self.bound or self.timeout, self.database,
                        f' statement="{shown}"' if shown else "")
        elif what not in self._failing:
            log.debug("action=database_timeout what=%s", what)
        self._failing[what] = time.monotonic()

    def _succeeded(self, what: str) -> None:
        if self._failing.pop(what, None) is not None and not self._failing:
            log.warning("action=database_timeouts_ended database=%s", self.database)

    def problem(self) -> str | None:
        """Why the database does not answer in time (``None`` when it does): the kinds
        of round trip whose last try timed out, and none of which succeeded since."""
        if not self._failing:
            return None
        now = time.monotonic()
        horizon = (self.bound or self.timeout) + FORGET_AFTER
        for what, at in list(self._failing.items()):
            if now - at > horizon:
                del self._failing[what]
        if not self._failing:
            return None
        kinds = ", ".join(f"{what} ({now - at:.1f} s ago)"
                          for what, at in sorted(self._failing.items()))
        return f"database round trips timed out and have not succeeded since: {kinds}"
