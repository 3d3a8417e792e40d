"""A uvicorn server run inside a process that owns its signals.

The processor, the demo and the console each serve HTTP from their own event loop
and decide themselves when to stop. uvicorn's own signal handling would take
SIGTERM and SIGINT from them while it serves (and re-raise the signal after
shutting down), so the server they embed handles no signals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn


class EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handling: the caller stops it (``should_exit``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # uvicorn releases before 0.29
        return
