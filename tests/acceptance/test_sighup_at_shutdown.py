"""A SIGHUP (a reload) that reaches ``processor run`` while it shuts down after SIGTERM
never ends it. The proof's seed 680766964 on SQLite sent one (``sighup`` to every
processor) 0.1 s after a SIGTERM, and the processor died of it (exit -1) once it had
let go of its signal handlers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import pytest

from tests.acceptance.harness.processes import FAST, spawn

pytestmark = pytest.mark.timeout(120)


async def test_sighups_during_a_graceful_shutdown_do_not_kill_it(
        db_url: str, table_prefix: str, tmp_path: Path) -> None:
    proc = await spawn("hup", ["run", "--handler-url", "http://127.0.0.1:9/unused",
                               "--db-url", db_url, "--table-prefix", table_prefix,
                               "--owner-id", "hup", "--health-port", "0", *FAST], tmp_path)
    try:
        await proc.wait_log("action=watcher_started", timeout=60)
        proc.process.send_signal(signal.SIGTERM)
        while proc.running:  # a reload asked for every moment of the shutdown
            with contextlib.suppress(ProcessLookupError):
                proc.process.send_signal(signal.SIGHUP)
            await asyncio.sleep(0.002)
        code = await proc.wait(30)
        assert code != -signal.SIGHUP, f"killed by a SIGHUP: {proc.stderr()[-2000:]}"
    finally:
        proc.kill()
        await proc.process.wait()
