"""PgBouncer in transaction mode in front of the test PostgreSQL, started on demand.

Used by the tests (a session fixture) and by ``.ci/run`` (``python3 -m
tests.support.pgbouncer``, after it installs Debian's ``pgbouncer`` package). Standard
library only, so that CI can run it before the project is installed.

The configuration is written to :data:`FOLDER` (owned by the ``postgres`` user, as
PgBouncer refuses to run as root): ``pool_mode = transaction``, listening on
127.0.0.1:6432, every database forwarded to 127.0.0.1:5432, and ``auth_type = trust``
with an auth file naming the ``postgres`` user. Starting is idempotent: when something
already answers on the port, it is asked (on PgBouncer's admin console) for its pool
mode, and anything but transaction pooling is an error rather than a quiet pass.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support import children

HOST = "127.0.0.1"
PORT = 6432
FOLDER = Path(os.environ.get("STATEFEED_PGBOUNCER_DIR", "/tmp/statefeed-pgbouncer"))
BINARY = "/usr/sbin/pgbouncer"
# How long a started PgBouncer may take to listen (a loaded machine is slow to start it).
START_DEADLINE = 60.0
INSTALL = "apt-get update && apt-get install -y pgbouncer"
# The statefeed URL of the test database through it.
POOLED_URL = f"postgresql://postgres@{HOST}:{PORT}/test?pooler=transaction"
# Server connections per database and user: a fleet of 16 processors shares them.
POOL_SIZE = 20

CONFIG = f"""\
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = {HOST}
listen_port = {PORT}
unix_socket_dir =
pool_mode = transaction
auth_type = trust
auth_file = {{folder}}/userlist.txt
admin_users = postgres
max_client_conn = 2000
default_pool_size = {POOL_SIZE}
ignore_startup_parameters = extra_float_digits
logfile = {{folder}}/pgbouncer.log
pidfile = {{folder}}/pgbouncer.pid
"""


class PgBouncerError(RuntimeError):
    """PgBouncer is not installed, did not start, or is not in transaction mode."""


def listening(host: str = HOST, port: int = PORT) -> bool:
    """Whether something accepts connections on ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def _write_config() -> Path:
    FOLDER.mkdir(parents=True, exist_ok=True)
    config = FOLDER / "pgbouncer.ini"
    config.write_text(CONFIG.format(folder=FOLDER))
    (FOLDER / "userlist.txt").write_text('"postgres" ""\n')
    if os.geteuid() == 0:
        shutil.chown(FOLDER, "postgres")
        for path in FOLDER.iterdir():
            shutil.chown(path, "postgres")
    return config


def _pool_mode() -> str:
    """The pool mode of the PgBouncer on :data:`PORT`, from its admin console.

    Raises:
        PgBouncerError: it does not answer as PgBouncer does.
    """
    import psycopg  # the project's driver; only needed once PgBouncer is up

    try:
        with psycopg.connect(host=HOST, port=PORT, user="postgres", dbname="pgbouncer",
                             autocommit=True, prepare_threshold=None,
                             connect_timeout=5) as conn:
            rows = conn.execute("SHOW CONFIG").fetchall()
    except psycopg.Error as error:
        raise PgBouncerError(
            f"something listens on {HOST}:{PORT} but its PgBouncer admin console does not "
            f"answer ({type(error).__name__}: {str(error).strip()})") from None
    for row in rows:
        if row[0] == "pool_mode":
            return str(row[1])
    raise PgBouncerError(f"the PgBouncer on {HOST}:{PORT} does not say its pool_mode")


def ensure(*, check_mode: bool = True) -> str:
    """Start PgBouncer in transaction mode unless it listens already; returns
    :data:`POOLED_URL`.

    Raises:
        PgBouncerError: it is not installed (the message names the command that
            installs it), did not start, or listens in another pool mode.
    """
    if not listening():
        if not Path(BINARY).exists():
            raise PgBouncerError(f"PgBouncer is not installed ({INSTALL})")
        config = _write_config()
        command = [BINARY, "-d", "-q", str(config)]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            command[1:1] = ["-u", "postgres"]
        # A daemon the run's test processes share: without the markers of the test
        # process that happened to start it, which kill what that process leaves
        # (tests/support/children.py). Its start is a deadline, not a speed goal.
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              env=children.unmarked_environment())
        deadline = time.monotonic() + START_DEADLINE
        while not listening() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not listening():
            log = FOLDER / "pgbouncer.log"
            tail = log.read_text(errors="replace")[-1000:] if log.exists() else ""
            raise PgBouncerError(f"PgBouncer did not start (exit {done.returncode}): "
                                 f"{done.stderr.strip()} {tail.strip()}")
    if check_mode:
        mode = _pool_mode()
        if mode != "transaction":
            raise PgBouncerError(f"the PgBouncer on {HOST}:{PORT} pools by {mode}, "
                                 "not by transaction")
    return POOLED_URL


def main() -> int:
    """Start it (``.ci/run``); prints where it listens. Exit 1 with the reason on failure."""
    try:
        ensure(check_mode="--no-check" not in sys.argv)
    except PgBouncerError as error:
        print(f"PgBouncer: {error}", file=sys.stderr)
        return 1
    print(f"PgBouncer (transaction pooling) is listening on {HOST}:{PORT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
