"""The packages stay cheap to import: the contract types load without SQLAlchemy's
async engine, and the heavy public names still import from the package."""

from __future__ import annotations

import subprocess
import sys

import pytest

ASYNC_ENGINE = "sqlalchemy.ext.asyncio"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter: this test process has loaded everything already.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("statement", [
    "import watcher.protocol",
    "from watcher import Result, WorkItem, RetryableError, NonRetryableError, Processor",
    "from watcher import Hooks, CountingHooks, NewItem, ConfigError",
    "from processor import NewItem, PartitionInfo, ItemInfo, ConfigError, DatabaseError",
])
def test_light_names_do_not_load_the_async_engine(statement: str) -> None:
    done = _run(f"import sys; {statement}; "
                f"assert {ASYNC_ENGINE!r} not in sys.modules, sorted(sys.modules)")
    assert done.returncode == 0, done.stderr[-2000:]


def test_heavy_names_load_on_first_use() -> None:
    done = _run(
        "import sys, watcher, processor\n"
        f"assert {ASYNC_ENGINE!r} not in sys.modules\n"
        "from watcher import Store, Watcher, WatcherConfig, Status\n"
        "from processor import Client, AsyncClient\n"
        "import watcher.store, processor.client.sync_client\n"
        "assert Store is watcher.store.Store and Client is processor.client.sync_client.Client\n"
        f"assert {ASYNC_ENGINE!r} in sys.modules\n"
        "assert {'Store', 'Watcher', 'WatcherConfig', 'Status'} <= set(dir(watcher))\n"
        "assert {'Client', 'AsyncClient'} <= set(dir(processor))\n"
        "assert set(watcher.__all__) <= set(dir(watcher))\n"
        "assert set(processor.__all__) <= set(dir(processor))\n")
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_unknown_name_is_an_attribute_error() -> None:
    import processor
    import watcher

    with pytest.raises(AttributeError, match="Nothing"):
        watcher.Nothing  # noqa: B018
    with pytest.raises(ImportError):
        from processor import Nothing  # noqa: F401
    assert not hasattr(processor, "Nothing")


HEAVY_FOR_HELP = ("sqlalchemy", "sqlmodel", "alembic", "aiohttp", "httpx", "uvicorn",
                  "starlette", "rich")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["status", "--help"],
                                  ["migrate", "--help"], ["console", "--help"],
                                  ["healthcheck", "--health-port", "1"]])
def test_cli_help_loads_no_database_or_http_library(argv: list[str]) -> None:
    # `processor --help` (and a verb's) only reads option defaults: it must not wait for
    # SQLAlchemy, SQLModel or an HTTP client to load. Nor must the image's health check
    # (here against a closed port: it answers 1), which runs every few seconds.
    done = _run(
        "import sys\n"
        f"sys.argv = ['processor', *{argv!r}]\n"
        "from processor.cli import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        f"    assert exit.code in {(1,) if argv[0] == 'healthcheck' else (0, None)!r}, exit.code\n"
        f"loaded = sorted(m for m in {HEAVY_FOR_HELP!r} if m in sys.modules)\n"
        "assert not loaded, loaded\n")
    assert done.returncode == 0, done.stderr[-2000:]
