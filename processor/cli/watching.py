"""Ctrl-C as a request to stop, for the CLI's verbs that redraw until it (``status --watch``).

Python turns SIGINT into a ``KeyboardInterrupt`` raised wherever the main thread
is. Raised in the middle of a database read, it abandons the read: its connection
is never returned to the pool nor closed, and a SQLite connection's worker thread
(aiosqlite's, which the interpreter waits for at exit) then waits for ever, so the
process never exits. Here the first Ctrl-C only sets a flag and wakes the wait
between two redraws; the read under way (if any) ends, and the verb stops and
closes its client as at any other end. A second Ctrl-C raises ``KeyboardInterrupt``
as usual, for a read that does not end.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading
import time
from types import FrameType, TracebackType


class CtrlC:
    """A context in which SIGINT sets :attr:`stopped` (and wakes :meth:`sleep`) instead of
    raising; the previous handler comes back at the end. Outside the main thread, where
    no signal handler can be set, and where SIGINT is ignored, it changes nothing."""

    def __init__(self) -> None:
        self.stopped = False
        self._wake, self._waker = socket.socketpair()
        self._waker.setblocking(False)
        self._previous: object = None
        self._installed = False

    def __enter__(self) -> CtrlC:
        # A process started with SIGINT ignored (in the background) keeps ignoring it.
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
        self._wake.close()
        self._waker.close()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag and a byte: no lock is taken, so the main thread can be anywhere.
        if self.stopped:
            raise KeyboardInterrupt
        self.stopped = True
        with contextlib.suppress(OSError):
            self._waker.send(b"\0")

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if Ctrl-C comes; whether it has come."""
        if not self._installed:
            time.sleep(seconds)
            return self.stopped
        if not self.stopped:
            select.select([self._wake], [], [], seconds)
        return self.stopped
