"""The processes a test process started, found by markers in their environment, so
that none outlives the test (or the run) that started it.

Two markers, inherited by every process a test starts (the harness passes
``{**os.environ, ...}``) and by their children, even after their parent died and they
were handed to init: ``STATEFEED_TEST_RUN``, the pid of the run's first pytest process
(the xdist controller), and ``STATEFEED_TEST_WORKER``, the pid of the test process
itself. The conftest notes this worker's marked processes before each test; those still
alive after the test's own cleanup are leftovers: they are killed (with their process
group when they lead one) and reported. When the run ends, the controller kills every
process that still carries the run's marker.

Linux only (``/proc``); elsewhere nothing is found and nothing is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

RUN = "STATEFEED_TEST_RUN"
WORKER = "STATEFEED_TEST_WORKER"


def mark_this_process() -> None:
    """Put the markers in this process's environment (inherited by what it starts): the
    run's, unless a parent pytest process set it, and this process's own."""
    os.environ.setdefault(RUN, str(os.getpid()))
    os.environ[WORKER] = str(os.getpid())


def unmarked_environment() -> dict[str, str]:
    """This environment without the markers: for a daemon the whole run shares (one
    PgBouncer for every worker), which no test owns."""
    return {name: value for name, value in os.environ.items() if name not in (RUN, WORKER)}


def _state(pid: int) -> str | None:
    """The process's state letter (``Z`` for a zombie), or ``None`` when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def _command(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(word.decode(errors="replace") for word in words if word)[:200]


def marked(marker: str = WORKER) -> dict[int, str]:
    """The live (not zombie) processes whose environment carries this process's value
    of ``marker`` (:data:`WORKER`: started by this test process; :data:`RUN`: by any
    of the run's), other than this process: pid -> command line."""
    value = os.environ.get(marker, "")
    if not value:
        return {}
    needle = f"{marker}={value}".encode()
    me = os.getpid()
    found: dict[int, str] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle in environ.split(b"\0") and _state(pid) not in (None, "Z"):
            found[pid] = _command(pid)
    return found


def descendants(pid: int | None = None) -> dict[int, str]:
    """The live (not zombie) descendants of ``pid`` (this process by default): pid ->
    command line. Cheap (no scan of every process), so it runs around every test; a
    process whose parent died is no descendant any more, which :func:`marked` finds."""
    found: dict[int, str] = {}
    parents = [os.getpid() if pid is None else pid]
    while parents:
        parent = parents.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                listed = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, listed):
                if child not in found and _state(child) not in (None, "Z"):
                    found[child] = _command(child)
                    parents.append(child)
    return found


def kill(pids: dict[int, str]) -> None:
    """SIGKILL each process, and its process group when it leads one (a ``processor``
    started in a session of its own takes its children with it)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid and pid != os.getpgrp():
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
