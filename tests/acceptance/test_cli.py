"""The ``processor`` CLI as real subprocesses, against a real uvicorn handler on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import wait_until
from tests.support.handler_apps import TwoGateHandler
from tests.support.servers import free_port, serve_app

PROCESSOR = str(Path(sys.executable).with_name("processor"))
FAST = ["--poll-interval", "0.1", "--lease-duration", "3", "--retry-backoff", "0.1"]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    """Run the processor CLI to completion."""
    return subprocess.run([PROCESSOR, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


async def start(*args: str) -> asyncio.subprocess.Process:
    """Start ``processor`` in the background with its output captured."""
    return await asyncio.create_subprocess_exec(
        PROCESSOR, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def stop(process: asyncio.subprocess.Process, grace: float = 20) -> tuple[int, str]:
    """SIGTERM a processor and return its exit code and stderr."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), grace)
    except TimeoutError:
        process.kill()
        _, stderr = await process.communicate()
        raise AssertionError(f"processor did not exit {grace} s after SIGTERM:\n"
                             f"{stderr.decode()}") from None
    return process.returncode, stderr.decode()


async def test_migrate_run_status(db_url, tmp_path) -> None:
    prefix = f"cli{os.getpid()}_"
    migrated = cli("migrate", "--db-url", db_url, "--table-prefix", prefix)
    assert migrated.returncode == 0, migrated.stderr
    assert "up to date" in migrated.stdout
    handler = TwoGateHandler()
    health_port = free_port()
    try:
        async with AsyncClient(db_url, prefix) as client:
            await client.create_partition(
                "job", [NewItem(f"i{n}", f"resume {n}".encode()) for n in range(12)])
            async with serve_app(handler) as base_url:
                process = await start(
                    "run", "--handler-url", f"{base_url}/", "--db-url", db_url,
                    "--table-prefix", prefix, "--health-port", str(health_port),
                    "--owner-id", "cli-test", *FAST)
                try:
                    info = await client.wait("job", timeout=30)
                    assert info.status == "complete" and info.counts == {"complete": 12}
                    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{health_port}"
                                                 ) as http:
                        assert (await http.get("/healthz")).status_code == 200
                        ready = await http.get("/readyz")
                        assert ready.status_code == 200, ready.text
                        metrics = (await http.get("/metrics")).text
                    assert 'statefeed_items_total{outcome="complete"} 12.0' in metrics
                    assert 'statefeed_items_total{outcome="advanced"} 12.0' in metrics
                    assert "statefeed_gate_advances_total 1.0" in metrics
                finally:
                    code, stderr = await stop(process)
                assert code == 0, stderr
                assert "Traceback" not in stderr
            items = await client.items("job")
            assert {item.data for item in items} == {
                json.dumps({"seen": f"resume {n}"}, separators=(",", ":")).encode()
                for n in range(12)}
        assert len(handler.calls) == 24
        shown = cli("status", "--db-url", db_url, "--table-prefix", prefix, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout) == [
            {"id": "job", "status": "complete", "gate": 1, "owner": "",
             "counts": {"complete": 12}}]
        table = cli("status", "--db-url", db_url, "--table-prefix", prefix)
        assert table.returncode == 0 and "job" in table.stdout and "complete" in table.stdout
    finally:
        from watcher.migrate import downgrade

        downgrade(db_url, prefix)


async def test_sigterm_hands_over_to_a_second_processor(db_url) -> None:
    """After SIGTERM the partition moves to the other processor well within its 30 s lease."""
    prefix = f"hand{os.getpid()}_"
    assert cli("migrate", "--db-url", db_url, "--table-prefix", prefix).returncode == 0
    handler = TwoGateHandler(hold=asyncio.Event())
    common = ["--db-url", db_url, "--table-prefix", prefix, "--health-port", "0",
              "--poll-interval", "0.1", "--lease-duration", "30", "--shutdown-timeout", "10"]
    try:
        async with AsyncClient(db_url, prefix) as client, serve_app(handler) as base_url:
            await client.create_partition("job", [NewItem("a", b"1"), NewItem("b", b"2")])
            first = await start("run", "--handler-url", base_url, "--owner-id", "first", *common)
            second = None
            try:
                await wait_until(lambda: len(handler.calls) == 2, timeout=20,
                                 message="first processor dispatching")
                health = free_port()
                second = await start("run", "--handler-url", base_url, "--owner-id", "second",
                                     *common, "--health-port", str(health))
                await wait_until(lambda: _ready(health), timeout=20, message="second is ready")
                first.send_signal(signal.SIGTERM)
                stopped_at = time.monotonic()
                handler.hold.set()  # in-flight calls finish during the graceful stop
                code, stderr = await stop(first)
                assert code == 0, stderr
                info = await wait_until(lambda: _owned_by(client, "second"), timeout=5,
                                        message="second processor takes over")
                took = time.monotonic() - stopped_at
                done = await client.wait("job", timeout=20)
                assert done.status == "complete"
                print(f"handoff after SIGTERM: {took:.2f} s; gate when taken: {info.gate}")
            finally:
                if second is not None:
                    code, stderr = await stop(second)
                    assert code == 0, stderr
        gate0 = [c for c in handler.calls if c.gate == 0]
        assert sorted(c.item_id for c in gate0) == ["a", "b"], "gate-0 results were kept"
    finally:
        from watcher.migrate import downgrade

        downgrade(db_url, prefix)


async def _ready(port: int) -> bool:
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
    except httpx.TransportError:
        return False


async def _owned_by(client, owner):
    info = await client.partition("job")
    return info if info.owner == owner or (info.status == "complete") else None


SECRET = "hunter2-do-not-log"


@pytest.mark.parametrize(("args", "fragment"), [
    (["run"], "--handler-url is required"),
    (["run", "--handler-url", "ftp://x"], "handler"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--db-url", "nonsense"], "malformed"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--concurrency", "0"], "concurrency"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--concurrency", "many"], "--concurrency"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--lease-duration", "0.5"],
     "lease duration"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--table-prefix", "Bad-Prefix"],
     "table prefix"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--handler-header", "NoColon"], "header"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--exit-on-db-error", "--health-port", "0",
      "--db-url", f"postgresql://app:{SECRET}@127.0.0.1:1/db"], "unavailable"),
    (["migrate", "--db-url", f"postgresql://app:{SECRET}@127.0.0.1:1/db"], "unavailable"),
    (["status", "--db-url", f"postgresql://app:{SECRET}@127.0.0.1:1/db"], "failed"),
    (["status", "--db-url", f"oracle://app:{SECRET}@h/db"], "not supported"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--log-level", "loud"], "--log-level"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--handler-batch-size", "-1"],
     "batch size"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--http-transport", "curl"], "transport"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--health-port", "70000"], "health port"),
])
def test_bad_configuration_is_one_clear_line(args, fragment, tmp_path) -> None:
    done = cli(*args, env={"PROCESSOR_DB_URL": f"sqlite:///{tmp_path / 'x.db'}"}, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert fragment in output
    assert "Traceback" not in output
    assert SECRET not in output


def test_environment_variables_configure_the_cli(tmp_path) -> None:
    done = cli("run", env={"PROCESSOR_HANDLER_URL": "http://127.0.0.1:9",
                           "PROCESSOR_CONCURRENCY": "0"})
    assert done.returncode != 0 and "concurrency" in done.stderr


def test_migrate_sql_prints_ddl_without_connecting() -> None:
    done = cli("migrate", "--sql", "--db-url", f"postgresql://app:{SECRET}@nowhere.invalid/db",
               "--table-prefix", "sf_")
    assert done.returncode == 0, done.stderr
    assert "CREATE TABLE sf_items" in done.stdout and SECRET not in done.stdout


def test_handler_headers_from_the_environment_one_per_line(tmp_path) -> None:
    """Header values contain spaces, so the environment form is one header per line."""
    done = cli("run", env={"PROCESSOR_HANDLER_URL": "http://127.0.0.1:9",
                           "PROCESSOR_HANDLER_HEADER": "Authorization: Bearer a b\nBroken"})
    assert done.returncode == 2
    assert "Broken" in done.stderr or "header" in done.stderr
    assert "Bearer a b" not in done.stderr


def test_demo_runs_the_resume_pipeline() -> None:
    done = cli("demo", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "top 5 candidates" in done.stdout
    assert "complete: 36 resumes ranked" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
