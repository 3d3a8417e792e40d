"""One-shot runs of the ``processor`` command, forked from a server that imported it
once (:mod:`tests.support.forkserver`), with what ``subprocess.run`` gives: the
arguments, exit code, stdout and stderr of a separate process.

One server per test process, started on first use and stopped at exit. Set
``STATEFEED_TEST_FORK=0`` to run every command as a fresh ``processor`` process
instead (the same results, a second slower each).
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT_DIR = Path(__file__).resolve().parents[2]
PROCESSOR = str(Path(sys.executable).with_name("processor"))
FORKING = hasattr(os, "fork") and hasattr(socket, "send_fds") and (
    os.environ.get("STATEFEED_TEST_FORK", "1") != "0")

_server: tuple[int, subprocess.Popen[bytes], str] | None = None
_lock = threading.Lock()


def _server_path() -> str:
    """The socket of this process's fork server, started when there is none.

    Raises:
        RuntimeError: the server did not start within 60 s.
    """
    global _server
    with _lock:
        if _server is not None and _server[0] == os.getpid() and _server[1].poll() is None:
            return _server[2]
        path = str(Path(tempfile.mkdtemp(prefix="statefeed-fork-")) / "socket")
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forkserver", path], cwd=ROOT_DIR,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(server.kill)
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"the fork server did not start (exit {server.poll()})")
            time.sleep(0.01)
        _server = (os.getpid(), server, path)
        return path


def server_pids() -> set[int]:
    """The pid of this process's fork server while it runs (it lives as long as the
    test process, not as one test: the leftover-process check leaves it alone)."""
    server = _server
    if server is not None and server[0] == os.getpid() and server[1].poll() is None:
        return {server[1].pid}
    return set()


def _drain(fd: int, into: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as stream:
        into.append(stream.read())


def _feed(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as stream:
        try:
            stream.write(data)
        except BrokenPipeError:
            pass


def run_processor(args: tuple[str, ...] | list[str], *, input: bytes | None = None,
                  env: dict[str, str], cwd: Path | str | None = None, timeout: float = 60,
                  ) -> subprocess.CompletedProcess[bytes]:
    """``processor *args`` to its end, with ``input`` on its stdin (else an empty one),
    ``env`` as its whole environment and ``cwd`` as its directory; its output captured.

    Raises:
        subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds (it is killed).
    """
    argv = [PROCESSOR, *args]
    if not FORKING:
        return subprocess.run(argv, input=input or b"", capture_output=True, timeout=timeout,
                              env=env, cwd=cwd, check=False)
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    request = {"argv": argv, "env": env, "cwd": str(cwd or os.getcwd())}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(_server_path())
        socket.send_fds(conn, [json.dumps(request).encode()], [stdin_r, out_w, err_w])
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
        out: list[bytes] = []
        err: list[bytes] = []
        workers = [threading.Thread(target=_drain, args=(out_r, out), daemon=True),
                   threading.Thread(target=_drain, args=(err_r, err), daemon=True),
                   threading.Thread(target=_feed, args=(stdin_w, input or b""), daemon=True)]
        for worker in workers:
            worker.start()
        conn.settimeout(timeout)
        answer = conn.makefile("rb")
        pid = int(answer.readline())
        try:
            code = int(answer.readline())
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            for worker in workers:
                worker.join(5)
            raise subprocess.TimeoutExpired(argv, timeout, b"".join(out), b"".join(err)
                                            ) from None
        for worker in workers:
            worker.join()
    return subprocess.CompletedProcess(argv, code, b"".join(out), b"".join(err))


def as_text(done: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[str]:
    """``done`` with its output decoded as ``subprocess.run(text=True)`` does."""
    encoding = locale.getpreferredencoding(False)

    def text(data: bytes) -> str:
        return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")

    return subprocess.CompletedProcess(done.args, done.returncode, text(done.stdout),
                                       text(done.stderr))
