"""Shared fixtures: real SQLite, PostgreSQL and MariaDB databases, an empty namespace per test."""

from __future__ import annotations

import asyncio
import compileall
import os
import signal
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.support import children, forked_cli
from tests.support.namespaces import NamespacePool, fresh_namespace, set_session_pool
from watcher.store import Store
from watcher.store.db.urls import parse_database_url, redact_url

# Every process a test process starts carries its markers (tests/support/children.py):
# what a test leaves running is killed after it, and what the run leaves at its end.
children.mark_this_process()

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_URL = os.environ.get("PROCESSOR_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
MARIADB_URL = os.environ.get("PROCESSOR_TEST_MARIADB_URL", DEFAULT_MARIADB_URL)
# No SQL Server runs on the project's machines: the SQL Server variants run only
# when a user points them at theirs, and skip (even under CI) otherwise.
MSSQL_URL_ENV = "PROCESSOR_TEST_MSSQL_URL"
MSSQL_URL = os.environ.get(MSSQL_URL_ENV, "")
MSSQL_NOT_SET = (f"SQL Server: set {MSSQL_URL_ENV}=mssql://user:password@host:1433/database "
                 f"(and pip install -e '.[test,mssql]') to run these against your server")


def _reachable(url: str) -> str | None:
    """``None`` when ``url`` answers ``SELECT 1``, otherwise the reason it does not."""
    try:
        engine = create_engine(parse_database_url(url).sync_url)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as error:  # any failure means "not reachable"
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


# Per server: False = not checked yet, None = reachable, text = why not.
_PROBLEMS: dict[str, str | bool | None] = {"PostgreSQL": False, "MariaDB": False,
                                           "SQL Server": False}


def _require(server: str, url: str) -> None:
    """Skip (locally) or fail (when CI is set) if ``server`` at ``url`` is not reachable."""
    if _PROBLEMS[server] is False:
        _PROBLEMS[server] = _reachable(url)
    problem = _PROBLEMS[server]
    if problem:
        message = f"{server} at {redact_url(url)} is not reachable ({problem})"
        if os.environ.get("CI"):
            pytest.fail(message + f"; CI must run the {server} tests", pytrace=False)
        pytest.skip(message)


def require_postgres() -> None:
    """Skip (locally) or fail (when CI is set) if PostgreSQL is not reachable."""
    _require("PostgreSQL", POSTGRES_URL)


def require_mariadb() -> None:
    """Skip (locally) or fail (when CI is set) if MariaDB (or MySQL) is not reachable."""
    _require("MariaDB", MARIADB_URL)


# The benchmark's peers (the bench extra): what the comparisons import.
BENCH_PEERS = ("pgqueuer", "asyncpg", "celery", "redis")


def require_bench_peers() -> None:
    """Skip (locally) or fail (when CI is set) without the benchmark's peers: the smoke
    runs compare statefeed with PGQueuer and Celery, installed by the ``bench`` extra."""
    import importlib.util

    missing = [name for name in BENCH_PEERS if importlib.util.find_spec(name) is None]
    if missing:
        message = (f"the benchmark's peers are not installed ({', '.join(missing)}): "
                   "pip install -e '.[test,bench]'")
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the benchmark smoke tests", pytrace=False)
        pytest.skip(message)


def require_extra(module: str, extra: str, what: str) -> None:
    """Skip (locally) or fail (when CI is set, whose ``.ci/run`` installs every extra the
    tests use) when ``module``, from the ``extra`` extra, is not installed; ``what`` says
    what needs it. For a test that needs a package outside ``[test]`` in one place; a
    module that needs it throughout skips at its top instead (tests/integration/test_tracing.py)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        message = f"{what} needs the {extra} extra: pip install -e '.[test,{extra}]'"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI installs it", pytrace=False)
        pytest.skip(message)


def require_promtool() -> str:
    """The path of Prometheus's ``promtool``; skip (locally) or fail (when CI is set)
    without it. Debian's ``prometheus`` package has it; ``.ci/run`` installs that."""
    import shutil

    path = shutil.which("promtool")
    if path is None:
        message = ("promtool is not installed (Debian's prometheus package: "
                   "apt-get install prometheus)")
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must check the metrics with it", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def pooled_postgres_url() -> str:
    """The test PostgreSQL database through PgBouncer in transaction mode (a statefeed
    URL with ``pooler=transaction``), started here when it is not listening
    (:mod:`tests.support.pgbouncer`); skip (locally) or fail (when CI is set) when it
    cannot be, naming the command that installs it."""
    from tests.support import pgbouncer

    require_postgres()
    try:
        return pgbouncer.ensure()
    except pgbouncer.PgBouncerError as error:
        message = f"PgBouncer: {error}"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the pooled fleet tests", pytrace=False)
        pytest.skip(message)


def require_mssql() -> None:
    """Skip with :data:`MSSQL_NOT_SET` when no SQL Server is configured; fail when one is
    configured (``$PROCESSOR_TEST_MSSQL_URL``) but does not answer or pymssql is missing:
    a user who asked for the SQL Server run must not get a quiet pass."""
    if not MSSQL_URL:
        pytest.skip(MSSQL_NOT_SET)  # reported once, by pytest_runtest_makereport
    if _PROBLEMS["SQL Server"] is False:
        _PROBLEMS["SQL Server"] = _reachable(MSSQL_URL)
    problem = _PROBLEMS["SQL Server"]
    if problem:
        hint = ("; install its driver: pip install -e '.[test,mssql]'"
                if "ModuleNotFoundError" in str(problem) else "")
        pytest.fail(f"SQL Server at {redact_url(MSSQL_URL)} ({MSSQL_URL_ENV}) is not "
                    f"reachable ({problem}){hint}", pytrace=False)


# The costly layers, each a marker (registered in pyproject.toml) that ``--quick``
# leaves out. The acceptance layer runs the CLI as processes; a few of its modules
# also need a container engine or run the benchmark; a test asking for Chromium is
# a browser test; the soak tests carry ``soak`` themselves.
QUICK_LEAVES_OUT = ("processes", "container", "browser", "bench", "soak")
# ``--quick`` runs the database tests on SQLite and PostgreSQL: MariaDB's driver (pure
# Python) makes its runs the costliest of the three, and SQL Server's need a server of
# your own. The full suite (and CI) runs them all.
QUICK_LEAVES_OUT_DATABASES = ("mariadb", "mssql")
# ... and PostgreSQL's runs only where they test the store's contract and the driver
# (conformance/ and databases/): the engine, API and console above the store run on
# SQLite there, and on every database in the full suite.
QUICK_POSTGRES_FOLDERS = tuple(Path(__file__).parent / name
                               for name in ("conformance", "databases"))
PROCESSES_FOLDER = Path(__file__).parent / "acceptance"
LAYER_OF_MODULE = {
    "test_container.py": "container",
    "test_bench_smoke.py": "bench",
    "test_bench_databases_smoke.py": "bench",
    "test_bench_every_database.py": "bench",
}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Let SIGINT interrupt, as in a terminal; compile the project's modules once (the
    controller, before any worker starts): where ``PYTHONDONTWRITEBYTECODE`` is set,
    every ``processor`` process the tests start would otherwise compile them again from
    source (about 0.3 s each)."""
    # A test run started in the background of a script (``cmd &``) inherits SIGINT
    # ignored, and so would every process it starts, which keep ignoring it: the tests
    # of Ctrl-C need it to work, as it does in a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not hasattr(session.config, "workerinput"):
        root = Path(__file__).resolve().parent.parent
        for package in ("watcher", "processor", "handlers"):
            compileall.compile_dir(root / package, quiet=1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick", action="store_true", default=False,
        help="the inner loop: leave out the costly layers (tests marked "
             + ", ".join(QUICK_LEAVES_OUT) + ") and the runs on "
             + " and ".join(QUICK_LEAVES_OUT_DATABASES)
             + "; PostgreSQL runs only the store's contract (conformance/, databases/)")


def layers_of(item: pytest.Item) -> set[str]:
    """The costly layers ``item`` belongs to (see :data:`QUICK_LEAVES_OUT`)."""
    layers = set()
    path = item.path
    if path.is_relative_to(PROCESSES_FOLDER):
        layers.add("processes")
        if path.name in LAYER_OF_MODULE:
            layers.add(LAYER_OF_MODULE[path.name])
    if "needs_chromium" in getattr(item, "fixturenames", ()):
        layers.add("browser")
    if item.get_closest_marker("soak") is not None:
        layers.add("soak")
    return layers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its costly layers; with ``--quick``, deselect those tests, the
    runs on the databases :data:`QUICK_LEAVES_OUT_DATABASES` names, and PostgreSQL's
    runs outside :data:`QUICK_POSTGRES_FOLDERS`."""
    left_out: list[pytest.Item] = []
    kept: list[pytest.Item] = []
    quick = config.getoption("--quick")
    for item in items:
        layers = layers_of(item)
        for layer in sorted(layers):
            item.add_marker(getattr(pytest.mark, layer))
        costly = bool(layers) or any(item.get_closest_marker(database) is not None
                                     for database in QUICK_LEAVES_OUT_DATABASES) or (
            item.get_closest_marker("postgres") is not None
            and not any(item.path.is_relative_to(folder) for folder in QUICK_POSTGRES_FOLDERS))
        (left_out if quick and costly else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def _utf8_safe(value: Any) -> Any:
    """``value`` with every string made UTF-8 encodable (a lone surrogate escaped)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_utf8_safe(key): _utf8_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_utf8_safe(item) for item in value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any
                                  ) -> Iterator[dict[str, Any] | None]:
    """Reports cross from an xdist worker as UTF-8: the tests of unpaired surrogates
    capture logs that hold one, which would otherwise crash the worker."""
    data = yield
    return _utf8_safe(data) if data is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[pytest.TestReport]:
    """Report every "no SQL Server configured" skip at one place, so ``-ra`` prints it as
    one line with a count instead of a line per test."""
    report = yield
    longrepr = report.longrepr
    if (report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3
            and str(longrepr[2]).endswith(MSSQL_NOT_SET)):
        report.longrepr = (__file__, require_mssql.__code__.co_firstlineno - 1, longrepr[2])
    return report


@pytest.fixture(params=[
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
    pytest.param("mssql", marks=pytest.mark.mssql),
])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL: a fresh SQLite file, or the shared PostgreSQL, MariaDB or (when
    ``$PROCESSOR_TEST_MSSQL_URL`` is set) SQL Server test database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'statefeed.db'}"
    if request.param == "mariadb":
        require_mariadb()
        return MARIADB_URL
    if request.param == "mssql":
        require_mssql()
        return MSSQL_URL
    require_postgres()
    return POSTGRES_URL


@pytest.fixture(scope="session", autouse=True)
def namespace_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespacePool]:
    """This test process's migrated namespaces (tests/support/namespaces.py), for the
    ``table_prefix`` fixture and the acceptance harness's clusters alike."""
    pool = NamespacePool(tmp_path_factory.mktemp("namespaces"))
    set_session_pool(pool)
    yield pool
    set_session_pool(None)
    pool.close()


@pytest.fixture
def table_prefix(db_url: str, namespace_pool: NamespacePool) -> Iterator[str]:
    """A table namespace of the test's own, migrated and empty: borrowed from the pool
    of namespaces migrated once per database (its rows deleted before the test), or on
    SQLite a copy of a migrated template file at the test's path."""
    with namespace_pool.borrow(db_url) as prefix:
        yield prefix


@pytest.fixture
def fresh_table_prefix(db_url: str) -> Iterator[str]:
    """A table namespace migrated for real before the test and dropped after it, for the
    tests of migrations and of what newly made tables look like (their statistics, their
    query plans); other tests use :func:`table_prefix`."""
    with fresh_namespace(db_url) as prefix:
        yield prefix


@pytest.fixture
async def make_store(db_url: str, table_prefix: str) -> AsyncIterator[Callable[..., Store]]:
    """Open stores on the test namespace; each has its own engine (like a separate process)."""
    stores: list[Store] = []

    def make(**kwargs: Any) -> Store:
        store = Store.open(db_url, table_prefix, **kwargs)
        stores.append(store)
        return store

    yield make
    for opened in stores:
        await opened.close()


@pytest.fixture
async def store(make_store: Callable[..., Store]) -> Store:
    """One store on the test namespace."""
    return make_store()


HANG_REPORT_AFTER = 120.0


@pytest.fixture(autouse=True)
async def _report_hung_tasks() -> AsyncIterator[None]:
    """Print every asyncio task's stack if a test runs suspiciously long (diagnostics only)."""
    loop = asyncio.get_running_loop()

    def report() -> None:
        print(f"\n=== test still running after {HANG_REPORT_AFTER} s; asyncio tasks: ===",
              file=sys.stderr)
        for task in asyncio.all_tasks(loop):
            print(f"--- {task!r}", file=sys.stderr)
            task.print_stack(file=sys.stderr)

    handle = loop.call_later(HANG_REPORT_AFTER, report)
    yield
    handle.cancel()


class LeftoverProcessWarning(UserWarning):
    """A test left a process running after its own cleanup (it was killed)."""


# How long a process the test stopped may take to exit by itself before it counts as
# left over (a stop that was sent but not waited for).
LEFTOVER_GRACE = 10.0
LEFTOVERS_KILLED = pytest.StashKey[dict[int, str]]()


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Kill, and report as a :class:`LeftoverProcessWarning`, every process the test
    started that outlives its cleanup (this fixture is set up first, so it is torn down
    last). The test process's descendants are checked after every test; for the
    ``processes`` layer, also every process with this test process's marker, which
    finds the children a killed parent left behind."""
    thorough = "processes" in layers_of(request.node)

    def running() -> dict[int, str]:
        found = children.descendants()
        if thorough:
            found.update(children.marked())
        return found

    before = set(running())
    yield

    def leftovers() -> dict[int, str]:
        spared = before | forked_cli.server_pids()
        return {pid: command for pid, command in running().items() if pid not in spared}

    left = leftovers()
    deadline = time.monotonic() + LEFTOVER_GRACE
    while left and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for their exit, with a deadline
        left = leftovers()
    if left:
        children.kill(left)
        warnings.warn(LeftoverProcessWarning(
            f"{request.node.nodeid} left {len(left)} process(es) running, now killed: "
            + "; ".join(f"{pid}: {command}" for pid, command in sorted(left.items()))),
            stacklevel=1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the run's first process (the xdist controller, after its workers ended): kill
    every process that still carries the run's marker, to be named in the summary."""
    if hasattr(session.config, "workerinput"):
        return
    left = {pid: command for pid, command in children.marked(children.RUN).items()
            if pid not in forked_cli.server_pids()}
    if left:
        children.kill(left)
    session.config.stash[LEFTOVERS_KILLED] = left


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Name the processes the run left behind (and :func:`pytest_sessionfinish` killed)."""
    left = config.stash.get(LEFTOVERS_KILLED, {})
    if left:
        terminalreporter.section("processes left running by the tests (killed)")
        for pid, command in sorted(left.items()):
            terminalreporter.line(f"{pid}: {command}")
