"""A plain install works: ``pip install statefeed`` without any extra, in a fresh venv.

The project is installed (not in editable mode, not with ``--no-deps``) into a new virtual
environment, so nothing of this checkout's environment leaks in: no aiomysql, no PyMySQL,
no pymssql. There the client imports, ``processor migrate`` and ``processor demo`` run on
SQLite, and a MariaDB or SQL Server URL is one line naming the extra to install.

Slow-ish (one ``pip install`` of the project, about half a minute with pip's cache warm):
the venv is built once per run, for every test here, whichever test process runs them.
A machine where pip cannot install the dependencies (no index, no cache) skips these
tests locally and fails them under CI.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OPTIONAL = ("aiomysql", "pymysql", "pymssql", "pgqueuer", "celery", "playwright")

pytestmark = [pytest.mark.install, pytest.mark.timeout(900)]


def _run(command: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # No PROCESSOR_* variable of the caller's may configure the commands under test.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PROCESSOR_") and name != "PYTHONPATH"}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A fresh venv holding ``pip install <this checkout>``, no extras; its bin folder.

    Built once per run: the test processes (pytest-xdist workers) share the run's
    folder, and the first to get its lock builds the venv there for the others.
    """
    if worker_id == "master":  # one process: this module's folder is the run's
        return _built(tmp_path_factory.mktemp("plain-install"))
    shared = tmp_path_factory.getbasetemp().parent / "plain-install"
    shared.mkdir(exist_ok=True)
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (shared / "built").exists():
            return shared / "venv" / "bin"
        bin_dir = _built(shared)
        (shared / "built").touch()
        return bin_dir


def _built(root: Path) -> Path:
    """``root / "venv"`` made and holding this checkout; its bin folder. Skips (fails
    under CI) where pip cannot install it."""
    done = _run([sys.executable, "-m", "venv", str(root / "venv")], root)
    assert done.returncode == 0, done.stderr[-2000:]
    bin_dir = root / "venv" / "bin"
    # A copy of the sources, so the build's scratch files never land in the checkout.
    source = root / "src"
    done = _run(["git", "-C", str(REPO), "ls-files", "-z"], root)
    if done.returncode == 0:
        for name in done.stdout.split("\0"):
            if name and (REPO / name).is_file():
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                (source / name).write_bytes((REPO / name).read_bytes())
    else:  # not a git checkout (an unpacked sdist): install it as it is
        source = REPO
    done = _run([str(bin_dir / "pip"), "install", "-q", "--disable-pip-version-check",
                 str(source)], root, timeout=600)
    if done.returncode != 0:
        problem = f"pip could not install statefeed into a fresh venv: {done.stderr[-1500:]}"
        if os.environ.get("CI"):
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    return bin_dir


def test_no_optional_package_is_installed(venv: Path) -> None:
    # What the other tests prove holds only if the extras' packages really are absent.
    done = _run([str(venv / "python"), "-c",
                 "import importlib.util, sys; "
                 f"print([n for n in {OPTIONAL!r} if importlib.util.find_spec(n)])"], venv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_client_migrate_and_demo_run_on_sqlite(venv: Path, tmp_path: Path) -> None:
    done = _run([str(venv / "python"), "-c",
                 "from processor import Client, AsyncClient\n"
                 "import watcher.store, processor.service, processor.console.server\n"
                 "print('imported')"], tmp_path)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-2000:]

    db_url = f"sqlite:///{tmp_path / 'plain.db'}"
    done = _run([str(venv / "processor"), "migrate", "--db-url", db_url], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"created statefeed's tables in {db_url}" in done.stdout
    done = _run([str(venv / "python"), "-c",
                 "from processor import Client, NewItem\n"
                 f"with Client({db_url!r}) as client:\n"
                 "    client.create_partition('p', [NewItem('a', b'{}')])\n"
                 "    print(client.partition('p').status)"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "available"
    done = _run([str(venv / "processor"), "status", "--db-url", db_url, "--json"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"p"' in done.stdout

    done = _run([str(venv / "processor"), "demo", "--resumes", "6", "--top", "2"], tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the inbox spawned 6 resumes; 4 resumes ranked, 2 unreadable" in (
        done.stdout.replace("\n", " "))


@pytest.mark.parametrize(("url", "extra", "packages"), [
    ("mysql://root@127.0.0.1:3306/test", "mysql", "aiomysql and pymysql"),
    ("mariadb://root@127.0.0.1:3306/test", "mysql", "aiomysql and pymysql"),
    ("mssql://sa:secret@127.0.0.1:1433/test", "mssql", "pymssql"),
])
@pytest.mark.parametrize("verb", [["migrate"], ["status"], ["items", "p"]])
def test_a_database_without_its_extra_is_one_line_naming_it(
        venv: Path, tmp_path: Path, url: str, extra: str, packages: str,
        verb: list[str]) -> None:
    done = _run([str(venv / "processor"), *verb, "--db-url", url], tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"pip install 'statefeed[{extra}]'" in lines[0]
    assert packages in lines[0]
    assert "secret" not in done.stderr
    # The SQL Server URL must not be reported as a missing MariaDB driver, nor the reverse.
    other = "aiomysql" if extra == "mssql" else "pymssql"
    assert other not in done.stderr
