"""The ``processor`` CLI as real subprocesses, against a real uvicorn handler on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from processor import AsyncClient, NewItem, PartitionInfo
from tests.acceptance.harness.processes import START_DEADLINE, Processor, run_cli, spawn
from tests.support.engine import wait_until
from tests.support.handler_apps import TwoGateHandler
from tests.support.servers import free_port, serve_app
from watcher.store.db.migrate import downgrade

FAST = ("--poll-interval", "0.1", "--lease-duration", "3", "--retry-backoff", "0.1")


@pytest.fixture
def migrated(db_url: str) -> Iterator[tuple[str, str]]:
    """(database URL, table prefix): a prefix ``processor migrate`` set up, dropped after.

    Raises:
        AssertionError: the migration failed.
    """
    prefix = f"cli{uuid.uuid4().hex[:8]}_"
    done = run_cli("migrate", "--db-url", db_url, "--table-prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert "created statefeed's tables in" in done.stdout and "+" not in done.stdout
    yield db_url, prefix
    downgrade(db_url, prefix)


@contextlib.asynccontextmanager
async def processor_run(directory: Path, owner: str, *args: str, health_port: int = 0
                  ) -> AsyncIterator[Processor]:
    """``processor run --owner-id owner *args`` for the block; SIGTERMed at its end.

    Raises:
        AssertionError: it did not exit 0, or printed a traceback; or the block
            failed an assertion (the message then ends with the processor's log).
    """
    proc = await spawn(owner, ["run", "--owner-id", owner, "--health-port", str(health_port),
                               *args], directory, health_port=health_port)
    try:
        yield proc
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- {owner}'s log:\n{proc.stderr()[-3000:]}") from None
    finally:
        code = await proc.terminate()
    assert code == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()


async def test_migrate_run_status(migrated, tmp_path) -> None:
    db_url, prefix = migrated
    handler = TwoGateHandler()
    async with AsyncClient(db_url, prefix) as client, serve_app(handler) as base_url:
        await client.create_partition(
            "job", [NewItem(f"i{n}", f"resume {n}".encode()) for n in range(12)])
        async with processor_run(tmp_path, "cli-test", "--handler-url", f"{base_url}/",
                                 "--db-url", db_url, "--table-prefix", prefix, *FAST,
                                 health_port=free_port()) as proc:
            info = await client.wait("job", timeout=30)
            assert info.status == "complete" and info.counts == {"complete": 12}
            assert (await proc.get("/healthz")).status_code == 200
            ready = await proc.get("/readyz")
            assert ready.status_code == 200, ready.text
            metrics = (await proc.get("/metrics")).text
            assert 'statefeed_items_total{outcome="complete",pipeline="default"} 12.0' in metrics
            assert 'statefeed_items_total{outcome="advanced",pipeline="default"} 12.0' in metrics
            assert 'statefeed_gate_advances_total{pipeline="default"} 1.0' in metrics
        items = await client.items("job")
    assert {item.data for item in items} == {
        json.dumps({"seen": f"resume {n}"}, separators=(",", ":")).encode() for n in range(12)}
    assert len(handler.calls) == 24
    shown = run_cli("status", "--db-url", db_url, "--table-prefix", prefix, "--json")
    assert shown.returncode == 0, shown.stderr
    async with AsyncClient(db_url, prefix) as client:
        final_version = (await client.partition("job")).version
    assert json.loads(shown.stdout) == [
        {"id": "job", "status": "complete", "gate": 1, "version": final_version,
         "owner": "", "counts": {"complete": 12},
         "reduce_gates": [], "on_item_failure": "fail", "reduce": None, "spawned": 0,
         "last_error": None, "key": None, "priority": 0, "paused": False, "paused_at": None,
         "result": None, "waiting": None, "pipeline": "default", "pipeline_version": None,
         "unserved": False}]
    table = run_cli("status", "--db-url", db_url, "--table-prefix", prefix)
    assert table.returncode == 0 and "job" in table.stdout and "complete" in table.stdout


async def test_handler_url_alone_serves_the_default_pipeline_only(migrated, tmp_path) -> None:
    """``--handler-url`` alone is the ``default`` pipeline, every version and gate to its
    one URL: a partition of another pipeline is never leased nor called there, and waits
    shown as unserved, while the default pipeline's partitions (versioned or not) run."""
    db_url, prefix = migrated
    where = ("--db-url", db_url, "--table-prefix", prefix)
    handler = TwoGateHandler()
    async with AsyncClient(db_url, prefix) as client, serve_app(handler) as base_url:
        await client.create_partition("plain", [NewItem("a", b"x"), NewItem("b", b"y")])
        await client.create_partition("pinned", [NewItem("a", b"z")], pipeline_version="v7")
        await client.create_partition("inv", [NewItem("a", b"w")], pipeline="invoices")
        async with processor_run(tmp_path, "plain-url", "--handler-url", f"{base_url}/",
                                 *where, *FAST, health_port=free_port()):
            for done in ("plain", "pinned"):
                assert (await client.wait(done, timeout=30)).status == "complete"
            shown = run_cli("processors", *where, "--json")
            assert shown.returncode == 0, shown.stderr
            assert [row["serves"] for row in json.loads(shown.stdout)] == [
                [{"pipeline": "default", "version": None, "gates": None}]], shown.stdout
            # Leased in the same reads as the two above, were it served.
            info = await client.partition("inv")
            assert info.status == "available" and info.owner == "", info
            status = run_cli("status", *where, "--json")
            rows = {row["id"]: row for row in json.loads(status.stdout)}
            assert rows["inv"]["unserved"] is True and rows["plain"]["unserved"] is False
    assert {call.partition_id for call in handler.calls} == {"plain", "pinned"}


async def test_run_reduces_a_gate_and_result_prints_it(migrated, tmp_path) -> None:
    from handlers.examples import resumes, samples

    db_url, prefix = migrated
    where = ("--db-url", db_url, "--table-prefix", prefix)
    documents = samples.sample_resumes(30, seed=4, unreadable=2)
    async with AsyncClient(db_url, prefix) as client, serve_app(resumes.app) as base_url:
        await client.create_partition(
            "job", [NewItem(f"r{n:02}", document) for n, document in enumerate(documents)],
            reduce_gates=[1], on_item_failure="continue")
        await client.create_partition("plain", [NewItem("a", b"{}")])
        async with processor_run(tmp_path, "reducer", "--handler-url", f"{base_url}/",
                                 *where, *FAST, "--reduce-page-items", "8",
                                 health_port=free_port()) as proc:
            info = await client.wait("job", timeout=60)
            assert info.status == "complete", info
            metrics = (await proc.get("/metrics")).text
            for step in ("fold", "apply"):
                assert ('statefeed_reduce_calls_total{outcome="applied",'
                        f'pass="{step}",pipeline="default"}} 4.0') in metrics, step
    assert info.counts == {"complete": 28, "failed": 2}
    shown = run_cli("result", "job", *where)
    assert shown.returncode == 0, shown.stderr
    ranking = json.loads(shown.stdout)
    assert ranking == info.result_json()
    assert (ranking["ranked"], ranking["failed_count"], len(ranking["top"])) == (28, 2, 10)
    status = run_cli("status", *where, "--json")
    rows = {row["id"]: row for row in json.loads(status.stdout)}
    assert rows["job"]["result"] == ranking and rows["job"]["reduce_gates"] == [1]
    assert rows["job"]["on_item_failure"] == "continue" and rows["job"]["reduce"] is None
    missing = run_cli("result", "nope", *where)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == [
        "processor: error: partition 'nope' does not exist; create it with `processor create "
        "nope --items FILE`, or list the partitions with `processor status`"]
    empty = run_cli("result", "plain", *where)
    assert empty.returncode == 3 and "has no result yet" in empty.stderr
    assert len(empty.stderr.strip().splitlines()) == 1


async def test_sigterm_hands_over_to_a_second_processor(migrated, tmp_path) -> None:
    """After SIGTERM the partition moves to the other processor well within its 30 s lease."""
    db_url, prefix = migrated
    handler = TwoGateHandler(hold=asyncio.Event())
    common = ("--db-url", db_url, "--table-prefix", prefix, "--poll-interval", "0.1",
              "--lease-duration", "30", "--shutdown-timeout", "10")
    async with AsyncClient(db_url, prefix) as client, serve_app(handler) as base_url:
        await client.create_partition("job", [NewItem("a", b"1"), NewItem("b", b"2")])
        async with processor_run(tmp_path, "first", "--handler-url", base_url, *common) as first:
            await wait_until(lambda: len(handler.calls) == 2, timeout=20,
                             message="first processor dispatching")
            async with processor_run(tmp_path, "second", "--handler-url", base_url, *common,
                                     health_port=free_port()) as second:
                await wait_until(lambda: _ready(second), timeout=START_DEADLINE,
                                 message="second is ready")
                first.process.send_signal(signal.SIGTERM)
                stopped_at = time.monotonic()
                handler.hold.set()  # in-flight calls finish during the graceful stop
                assert await first.wait(20) == 0, first.stderr()
                # A deadline, not a bound: the speed of a handoff is the benchmark's.
                info = await wait_until(lambda: _owned_by(client, "second"), timeout=30,
                                        message="second processor takes over")
                took = time.monotonic() - stopped_at
                done = await client.wait("job", timeout=20)
                assert done.status == "complete"
                print(f"handoff after SIGTERM: {took:.2f} s; gate when taken: {info.gate}")
    gate0 = [c for c in handler.calls if c.gate == 0]
    assert sorted(c.item_id for c in gate0) == ["a", "b"], "gate-0 results were kept"


async def _ready(proc: Processor) -> bool:
    answer = await proc.answer("/readyz")
    return answer is not None and answer.status_code == 200


async def _owned_by(client: AsyncClient, owner: str) -> PartitionInfo | None:
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
    done = run_cli(*args, env={"PROCESSOR_DB_URL": f"sqlite:///{tmp_path / 'x.db'}"})
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert fragment in output
    assert "Traceback" not in output
    assert SECRET not in output


def test_environment_variables_configure_the_cli(tmp_path) -> None:
    done = run_cli("run", env={"PROCESSOR_HANDLER_URL": "http://127.0.0.1:9",
                           "PROCESSOR_DB_URL": f"sqlite:///{tmp_path / 'x.db'}",
                           "PROCESSOR_CONCURRENCY": "0"})
    assert done.returncode != 0 and "concurrency" in done.stderr


def test_migrate_sql_prints_ddl_without_connecting() -> None:
    done = run_cli("migrate", "--sql", "--db-url", f"postgresql://app:{SECRET}@nowhere.invalid/db",
               "--table-prefix", "sf_")
    assert done.returncode == 0, done.stderr
    assert "CREATE TABLE sf_items" in done.stdout and SECRET not in done.stdout


def test_handler_headers_from_the_environment_one_per_line(tmp_path) -> None:
    """Header values contain spaces, so the environment form is one header per line."""
    done = run_cli("run", env={"PROCESSOR_HANDLER_URL": "http://127.0.0.1:9",
                           "PROCESSOR_DB_URL": f"sqlite:///{tmp_path / 'x.db'}",
                           "PROCESSOR_HANDLER_HEADER": "Authorization: Bearer a b\nBroken"})
    assert done.returncode == 2
    assert "Broken" in done.stderr or "header" in done.stderr
    assert "Bearer a b" not in done.stderr


def test_demo_runs_the_resume_pipeline() -> None:
    done = run_cli("demo", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "top 5 candidates (from the partition's result)" in done.stdout
    assert "complete: the inbox spawned 36 resumes; 34 resumes ranked, 2 unreadable" in (
        done.stdout.replace("\n", " "))
    assert done.stdout.count("skipped resume-") == 2
    assert "Traceback" not in done.stdout + done.stderr
