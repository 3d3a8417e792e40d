"""``processor healthcheck``: ask the running processor's health port whether it is alive.

It is the container's ``HEALTHCHECK``. Docker runs it beside ``processor run`` in the
same container, but with the image's command only: the options ``processor run`` was
started with (``docker run IMAGE run --health-port 18093``) are not in its arguments.
So it reads them where they are, from ``/proc``: the command line and environment of
the ``processor run`` process, parsed by ``processor run``'s own option parser, so
that a flag, a ``PROCESSOR_<OPTION>`` variable and a default resolve exactly as they
did for the processor. Where no such process can be read, its own environment (and
the defaults) decide, as they would for ``processor run`` started here.
"""

from __future__ import annotations

import contextlib
import http.client
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ENV_PREFIX = "PROCESSOR_"
# The addresses that mean "every interface": a check goes to loopback instead.
ANY_ADDRESS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}
DEFAULT_TIMEOUT = 3.0


class HealthOptionsError(ValueError):
    """The options of ``processor run`` do not parse (the parser's own message)."""


class Command(Protocol):
    """What is used of ``processor run``'s command: its option parser (Typer's Click)."""

    def make_context(self, info_name: str | None, args: list[str]) -> Any:
        """Parse ``args`` (and the environment) into a context whose ``params`` hold
        every option's value."""


@dataclass(frozen=True)
class RunningProcessor:
    """A ``processor run`` process: its id, the arguments after ``run``, and its
    environment (``None`` when it cannot be read, as for another user's process)."""

    pid: int
    args: tuple[str, ...]
    environ: Mapping[str, str] | None


@dataclass(frozen=True)
class HealthTarget:
    """Where the health endpoints answer, and what decided it (for the message)."""

    host: str
    port: int
    source: str

    def url(self, path: str) -> str:
        """The URL of ``path`` on this target, as a person would type it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"


def run_arguments(argv: list[str]) -> list[str] | None:
    """The arguments after ``run`` when ``argv`` is a ``processor run`` command line
    (``processor run ...``, ``python /venv/bin/processor run ...`` or
    ``python -m processor.cli run ...``), otherwise ``None``."""
    for index, word in enumerate(argv[:-1]):
        program = os.path.basename(word)
        module = index > 0 and argv[index - 1] == "-m" and word == "processor.cli"
        if (program == "processor" or module) and argv[index + 1] == "run":
            return argv[index + 2:]
    return None


def find_running_processors(proc: Path = Path("/proc"), *, own_pid: int | None = None
                            ) -> list[RunningProcessor]:
    """Every ``processor run`` process ``proc`` shows, lowest process id first (in a
    container, PID 1). Processes that end or hide while being read are passed by."""
    own_pid = os.getpid() if own_pid is None else own_pid
    try:
        entries = list(proc.iterdir())
    except OSError:  # no /proc (not Linux): nothing to find
        return []
    found = []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == own_pid:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        args = run_arguments([word for word in argv if word] if argv else [])
        if args is None:
            continue
        try:
            environ: dict[str, str] | None = _parse_environ((entry / "environ").read_bytes())
        except OSError:  # another user's process: its environment is private
            environ = None
        found.append(RunningProcessor(int(entry.name), tuple(args), environ))
    return sorted(found, key=lambda running: running.pid)


def _parse_environ(raw: bytes) -> dict[str, str]:
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}


@contextlib.contextmanager
def _processor_environment(environ: Mapping[str, str]) -> Iterator[None]:
    """Make ``environ``'s ``PROCESSOR_*`` variables (and only those) the ones
    ``os.environ`` holds, for the time of a parse."""
    # Copied first: ``environ`` may be ``os.environ`` itself.
    wanted = {name: value for name, value in environ.items() if name.startswith(ENV_PREFIX)}
    saved = {name: value for name, value in os.environ.items() if name.startswith(ENV_PREFIX)}
    try:
        for name in saved:
            del os.environ[name]
        os.environ.update(wanted)
        yield
    finally:
        for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
            del os.environ[name]
        os.environ.update(saved)


def health_address(run_command: Command, args: list[str] | tuple[str, ...],
                   environ: Mapping[str, str]) -> tuple[str, int]:
    """``(host, port)`` of the health endpoints of ``processor run *args`` started with
    ``environ``, resolved by ``run_command``'s own parser.

    Raises:
        HealthOptionsError: the arguments do not parse (a bad value, an unknown option).
    """
    with _processor_environment(environ):
        try:
            context = run_command.make_context("run", list(args))
        except Exception as error:  # the parser's usage errors, whichever Click made them
            format_message = getattr(error, "format_message", None)
            message = format_message() if callable(format_message) else str(error)
            raise HealthOptionsError(message or type(error).__name__) from None
    return str(context.params["health_host"]), int(context.params["health_port"])


def health_target(run_command: Command, *, port: int | None = None,
                  host: str | None = None, proc: Path = Path("/proc")) -> HealthTarget:
    """Where to check: ``port`` and ``host`` when given; otherwise what the running
    ``processor run`` was configured with, or this process's environment (with the
    defaults) when none can be read. A wildcard address is checked on loopback.

    Raises:
        HealthOptionsError: the options do not parse.
    """
    source = "this command's options"
    if port is None or host is None:
        running = find_running_processors(proc)
        if running:
            first = running[0]
            environ = first.environ if first.environ is not None else os.environ
            found_host, found_port = health_address(run_command, first.args, environ)
            source = f"the options of processor run (pid {first.pid})"
        else:
            found_host, found_port = health_address(run_command, [], os.environ)
            source = "PROCESSOR_HEALTH_PORT, PROCESSOR_HEALTH_HOST and the defaults"
        port = found_port if port is None else port
        host = found_host if host is None else host
    return HealthTarget(ANY_ADDRESS.get(host, host), port, source)


def probe(target: HealthTarget, path: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[bool, str]:
    """GET ``path`` from ``target``: ``(True, detail)`` on a 2xx answer. Never raises."""
    if target.port == 0:
        return False, ("the processor serves no health endpoints (health port 0, from "
                       f"{target.source}); start the container with --no-healthcheck")
    url = target.url(path)
    connection = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        status = response.status
        response.read()
    except (OSError, http.client.HTTPException) as error:
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        return False, f"{url} did not answer ({reason}; address from {target.source})"
    finally:
        connection.close()
    return 200 <= status < 300, f"{url} answered HTTP {status}"
