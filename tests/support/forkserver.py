"""A fork server for one-shot runs of the ``processor`` command in tests.

Starting ``processor`` costs two to three seconds of imports (SQLAlchemy, SQLModel,
the models, Typer, Rich) before the command does anything, and the acceptance layer
runs it well over a thousand times. This server imports the command, and every module
it may import, once; each run is then a
child forked from it: a separate process with the test's own stdin, stdout and stderr
(passed over a Unix socket), environment, working directory and arguments, whose exit
code (or the signal that killed it) comes back as ``subprocess`` reports it. Only the
imports are shared: nothing in ``processor`` or ``watcher`` does I/O, starts a thread
or reads the environment when imported, and the server forks before it does any.

Long-running processors (:mod:`tests.acceptance.harness.processes`) stay real
``processor`` processes: kill -9 tests and ``processor healthcheck`` read their command
lines from ``/proc``.

Protocol (one connection a run): the client sends one JSON line ``{"argv", "env",
"cwd"}`` with three descriptors (stdin, stdout, stderr); the server answers the child's
pid on one line, and its exit code on a second when it ends.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import sys
import traceback
import types
from collections.abc import Callable

MAX_REQUEST = 1 << 20


def _run_child(main: Callable[[], object], request: dict[str, object], fds: list[int]) -> None:
    """In the forked child: take the run's descriptors, environment, directory and
    arguments, run the command and exit with its code. Never returns."""
    code: object = 0
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = [str(arg) for arg in argv]
        # As the ``processor`` script's own: Click names the program from it.
        script = types.ModuleType("__main__")
        script.__file__ = sys.argv[0]
        sys.modules["__main__"] = script
        try:
            code = main()
        except SystemExit as stop:
            code = stop.code
        except BaseException:
            traceback.print_exc()
            code = 1
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code if isinstance(code, int) else 1)


# Not imported ahead: migration scripts (Alembic runs them), and ``__main__`` modules.
NOT_AHEAD = ("watcher.migrations", ".__main__")


def import_ahead() -> None:
    """Import every module of the three packages, and so the libraries they use
    (SQLAlchemy, the drivers, Rich, httpx, Starlette): the commands import them inside
    their functions, to keep ``processor --help`` light, and each forked run would
    otherwise pay for them again (about two seconds of the three a ``processor status``
    takes). A module that cannot be imported here (an extra not installed) is left to
    the run, which reports it as it would."""
    import importlib
    import pkgutil

    for package_name in ("watcher", "processor", "handlers"):
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if any(part in module.name for part in NOT_AHEAD):
                continue
            try:
                importlib.import_module(module.name)
            except Exception:  # an optional extra not installed: the run reports it
                continue


def serve(path: str) -> None:
    """Listen on the Unix socket ``path`` until the parent (the test worker) is gone."""
    from processor.cli import main  # the imports this server exists to pay once

    import_ahead()

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The client waits for ``path`` to exist: bind beside it, listen, then rename, so that
    # the path never names a socket that refuses connections (bound, not yet listening).
    listener.bind(path + ".bound")
    listener.listen(64)
    os.rename(path + ".bound", path)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        for _key, _events in selector.select(timeout=0.02):
            conn, _ = listener.accept()
            message, fds, _flags, _address = socket.recv_fds(conn, MAX_REQUEST, 3)
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in children.values():
                    other.close()
                _run_child(main, request, fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
