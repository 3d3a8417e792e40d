"""The operator's verbs as real ``processor`` subprocesses: items, retry, cancel, delete,
purge and set-gate, their errors, and ``processor run --retention`` with two processors
and the backlog gauges."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import Processor, run_cli, spawn
from tests.support.engine import wait_until
from tests.support.handler_apps import read_request
from tests.support.servers import answered_probe, free_port, send_json, serve_app
from watcher.records import ItemWrite
from watcher.store import Store
from watcher.store.db.clock import FixedClock
from watcher.store.db.migrate import upgrade

FAST = ("--poll-interval", "0.1", "--lease-duration", "3", "--retry-backoff", "0.1")
ERROR = "processor: error: "


@pytest.fixture
def migrated(db_url: str, table_prefix: str) -> tuple[str, str]:
    """(database URL, table prefix): an empty, migrated namespace."""
    return db_url, table_prefix


def one_error_line(done: Any, fragment: str, code: int = 2) -> str:
    """Assert the CLI failed with ``code`` and one line on stderr holding ``fragment``."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR), done.stderr
    assert fragment in lines[0], lines[0]
    assert done.stdout == "" and "Traceback" not in done.stderr
    return lines[0]


def ok(done: Any) -> str:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


async def _aged(store: Store, clock: FixedClock, partition_id: str, status: str, *,
                at: datetime, items: int) -> None:
    clock.set(at)
    await store.partition_create(partition_id, [NewItem(f"i{n}", b"x") for n in range(items)])
    [row] = [row for row in await store.leases_read_free(100) if row.id == partition_id]
    [won] = await store.leases_take([row], "setup", 30)
    await store.partition_transition(partition_id, won.version, "setup", status=status)


def _utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


async def test_operator_verbs(migrated) -> None:
    db_url, prefix = migrated
    where = ("--db-url", db_url, "--table-prefix", prefix)
    store = Store.open(db_url, prefix)
    clock = FixedClock(_utc_now())
    aged = Store.open(db_url, prefix, clock=clock)
    try:
        async with AsyncClient(db_url, prefix) as client:
            await client.create_partition("job", [NewItem(f"i{n}", b"{}") for n in range(5)])
            [lease] = await store.leases_take(await store.leases_read_free(5), "setup", 300)
            ready = {item.id: item for item in await store.items_ready("job", 0, 10)}
            assert await store.items_apply([
                ItemWrite("job", "i1", ready["i1"].version, "failed", 0, 6,
                          last_error="HTTP 422: the resume is a scan\nsecond line"),
                ItemWrite("job", "i3", ready["i3"].version, "complete", 0, 1)], "setup") == [
                True, True]
            await store.partition_transition("job", lease.version, "setup", status="failed")
            await client.create_partition("empty", [])
            await client.create_partition("busy", [NewItem("b", b"")])
            await store.leases_take(
                [r for r in await store.leases_read_free(10) if r.id == "busy"], "holder", 300)
            old = _utc_now() - timedelta(days=10)
            await _aged(aged, clock, "old-done", "complete", at=old, items=3)
            await _aged(aged, clock, "old-failed", "failed", at=old, items=2)

            # items: a table, JSON, filters and pages.
            table = ok(run_cli("items", "job", *where, "--status", "failed"))
            assert "i1" in table and "HTTP 422: the resume is a scan ..." in table
            assert "i0" not in table and "second line" not in table
            shown = json.loads(ok(run_cli("items", "job", *where, "--json")))
            assert [row["id"] for row in shown["items"]] == [f"i{n}" for n in range(5)]
            failed = shown["items"][1]
            assert (failed["status"], failed["attempts"], failed["last_error"]) == (
                "failed", 6, "HTTP 422: the resume is a scan\nsecond line")
            assert shown["next_cursor"] is None
            first = ok(run_cli("items", "job", *where, "--limit", "2"))
            assert first.strip().splitlines()[-1] == (
                "more: processor items job --limit 2 --after i1")
            page = json.loads(ok(run_cli("items", "job", *where, "--limit", "2", "--after",
                                         "i1", "--json")))
            assert [row["id"] for row in page["items"]] == ["i2", "i3"]
            assert page["next_cursor"] == "i3"
            done = json.loads(ok(run_cli("items", "job", *where, "--gate", "0", "--status",
                                         "complete", "--json")))
            assert [row["id"] for row in done["items"]] == ["i3"]

            # retry, cancel, set-gate.
            retried = json.loads(ok(run_cli("retry", "job", *where, "--json")))
            assert retried == {"id": "job", "status": "available", "gate": 0,
                               "status_before": "failed", "gate_before": 0, "reopened": True,
                               "items_reset": 1, "items_rerun": 0, "items_left_failed": 0,
                               "reduce_rearmed": False}
            await client.create_partition("finished", [NewItem("f", b"")])
            [won] = await store.leases_take(
                [r for r in await store.leases_read_free(10) if r.id == "finished"], "setup", 9)
            [f] = await store.items_ready("finished", 0, 10)
            assert await store.items_apply(
                [ItemWrite("finished", "f", f.version, "complete", 0, 0)], "setup") == [True]
            await store.partition_transition("finished", won.version, "setup", status="complete")
            assert ok(run_cli("retry", "finished", *where)).strip() == (
                "partition 'finished' is complete at gate 0; nothing to retry: no item of it "
                "failed")
            await client.delete_partition("finished")
            # The defect: a complete partition's failures were reset and left stranded, and a
            # re-armed reduce printed "0 failed item(s) reset". Each now says what it did.
            await client.create_partition("cont", [NewItem("a", b""), NewItem("b", b"")],
                                          on_item_failure="continue")
            [won] = await store.leases_take(
                [r for r in await store.leases_read_free(10) if r.id == "cont"], "setup", 9)
            ready = {item.id: item for item in await store.items_ready("cont", 0, 10)}
            assert await store.items_apply([
                ItemWrite("cont", "a", ready["a"].version, "failed", 0, 1, last_error="x"),
                ItemWrite("cont", "b", ready["b"].version, "complete", 1, 0)], "setup") == [
                True, True]
            await store.partition_transition("cont", won.version, "setup", gate=1,
                                             status="complete")
            assert ok(run_cli("retry", "cont", *where)).strip() == (
                "re-opened partition 'cont' (complete at gate 1) at gate 0; 1 failed item(s) "
                "reset")
            assert (await client.partition("cont")).status == "available"
            await client.create_partition("reducing", [NewItem("r", b"")], reduce_gates=[0])
            [won] = await store.leases_take(
                [r for r in await store.leases_read_free(10) if r.id == "reducing"], "setup", 9)
            await store.reduce_failed("reducing", won.version, "setup", attempts=6,
                                      error="the model is missing", fail=True)
            assert ok(run_cli("retry", "reducing", *where)).strip() == (
                "re-opened partition 'reducing' (failed at gate 0) at gate 0; 0 failed item(s) "
                "reset, its failed reduce re-armed")
            for partition_id in ("cont", "reducing"):
                await client.delete_partition(partition_id)
            said = ok(run_cli("cancel", "job", *where))
            assert said.startswith("cancelled partition 'job' at gate 0 (items: 4 available, "
                                   "1 complete)")
            again = json.loads(ok(run_cli("cancel", "job", *where, "--json")))
            assert (again["cancelled"], again["status"]) == (False, "cancelled")
            assert "already" in ok(run_cli("cancel", "job", *where))
            await client.create_partition("gated", [NewItem("g0", b""),
                                                    NewItem("g4", b"", gate=4)])
            await store.leases_take(
                [r for r in await store.leases_read_free(10) if r.id == "gated"], "setup", 300)
            [g0] = await store.items_ready("gated", 0, 10)
            assert await store.items_apply(
                [ItemWrite("gated", "g0", g0.version, "complete", 0, 0)], "setup") == [True]
            assert json.loads(ok(run_cli("set-gate", "gated", "2", *where, "--json"))) == {
                "id": "gated", "gate": 2, "status": "available"}
            one_error_line(run_cli("set-gate", "gated", "1", *where), "only moves forward")
            # Moves that mean nothing are refused, and write nothing.
            before = {pid: await client.partition(pid) for pid in ("empty", "old-done")}
            one_error_line(run_cli("set-gate", "gated", "5", *where),
                           "1 item(s) at gate 4 are still available")
            one_error_line(run_cli("set-gate", "empty", "2", *where),
                           "no item of it is available")
            one_error_line(run_cli("set-gate", "old-done", "99", *where), "it is complete")
            for pid, info in before.items():
                after = await client.partition(pid)
                assert (after.gate, after.version, after.status) == (
                    info.gate, info.version, info.status)
            assert (await client.partition("gated")).gate == 2
            await client.delete_partition("gated", force=True)

            # delete: refused while leased, forced, and plain.
            refused = one_error_line(run_cli("delete", "busy", *where),
                                     "processor 'holder' holds its lease")
            assert "--force" in refused
            assert (await client.partition("busy")).counts == {"available": 1}
            forced = json.loads(ok(run_cli("delete", "busy", "--force", *where, "--json")))
            assert forced == {"id": "busy", "deleted": True, "items": 1}
            assert ok(run_cli("delete", "job", *where)).strip() == (
                "deleted partition 'job' and its 5 item(s)")

            # purge: a dry run, then complete and cancelled only, then failed when asked.
            dry = json.loads(ok(run_cli("purge", "--older-than", "7d", "--dry-run", *where,
                                        "--json")))
            assert dry == {"dry_run": True, "partitions": 1, "items": 3,
                           "older_than_seconds": 604800.0,
                           "statuses": ["complete", "cancelled"]}
            assert ok(run_cli("purge", "--older-than", "7d", *where)).strip() == (
                "deleted 1 partition(s) (complete, cancelled, last updated more than 7d ago) "
                "and 3 item(s)")
            gone = json.loads(ok(run_cli("purge", "--older-than", "168h", "--status", "failed",
                                         *where, "--json")))
            assert (gone["partitions"], gone["items"]) == (1, 2)
            assert {info.id for info in await client.partitions()} == {"empty"}
    finally:
        await store.close()
        await aged.close()


@pytest.fixture(scope="module")
def sqlite_namespace(tmp_path_factory) -> tuple[str, ...]:
    """``--db-url`` of a migrated SQLite file, shared by the argument checks (none writes)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('ops') / 'ops.db'}"
    upgrade(url)
    return ("--db-url", url)


@pytest.mark.parametrize(("args", "fragment"), [
    *[(verb, "partition 'nope' does not exist") for verb in (
        ["items", "nope"], ["retry", "nope"], ["cancel", "nope"], ["delete", "nope"],
        ["set-gate", "nope", "1"])],
    (["items", "p", "--status", "bogus"], "unknown status 'bogus'"),
    (["items", "p", "--limit", "0"], "limit must be a whole number from 1 to 10000"),
    (["items", "p", "--gate", "-1"], "gate must be a whole number"),
    (["purge", "--older-than", "7x"], "--older-than must be a duration greater than 0"),
    (["purge", "--older-than", "0d"], "--older-than must be a duration greater than 0"),
    (["purge", "--older-than", "7d", "--status", "complete,available"],
     "only finished statuses"),
    (["purge", "--older-than", "7d", "--batch", "0"], "batch must be"),
    (["delete", "p", "--batch", "0"], "batch must be"),
    (["set-gate", "p", "--", "-5"], "gate must be a whole number"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--retention", "soon"],
     "--retention must be a duration"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--retention", "7d",
      "--retention-status", "available"], "only finished statuses"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--retention", "7d",
      "--retention-interval", "never"], "--retention-interval must be a duration"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--retention-items", "soon"],
     "--retention-items must be a duration"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--retention-items", "0s"],
     "--retention-items must be a duration"),
    (["run", "--handler-url", "http://127.0.0.1:9", "--backlog-interval", "0"],
     "backlog interval"),
])
def test_bad_arguments_are_one_clear_line(sqlite_namespace, args, fragment) -> None:
    one_error_line(run_cli(args[0], *sqlite_namespace, *args[1:]), fragment)


def test_missing_or_mistyped_arguments_exit_2_without_a_traceback(sqlite_namespace) -> None:
    for args in (["purge"], ["items"], ["set-gate", "p", "high"], ["items", "p", "--limit",
                                                                    "many"]):
        done = run_cli(args[0], *sqlite_namespace, *args[1:])
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def test_pipelines_create_list_and_move(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pipelines.db'}"
    upgrade(url)
    where = ("--db-url", url)
    one_error_line(run_cli("create", "bad", "--pipeline", "no spaces", *where),
                   "pipeline 'no spaces' must be ASCII letters")
    created = json.loads(ok(run_cli("create", "inv", "--pipeline", "invoices",
                                    "--pipeline-version", "v1", "--json", *where)))
    assert (created["pipeline"], created["pipeline_version"]) == ("invoices", "v1")
    moved = ok(run_cli("pipelines", "move", "inv", "--version", "v2", *where))
    assert moved.strip() == ("moved partition 'inv' of pipeline 'invoices' from version 'v1' "
                             "to version 'v2'")
    assert json.loads(ok(run_cli("pipelines", "list", "--json", *where))) == [
        {"pipeline": "invoices", "version": "v2", "open": 1, "leased": 0}]
    one_error_line(run_cli("pipelines", "move", "nope", "--version", "v2", *where),
                   "partition 'nope' does not exist")


class SelectiveHandler:
    """Two gates, like TwoGateHandler, but calls for partition ``stuck`` wait on ``hold``."""

    def __init__(self) -> None:
        self.hold = asyncio.Event()
        self.calls: list[tuple[str, str, int]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_probe(scope, send):
            return
        request = await read_request(scope, receive)
        self.calls.append((request.partition_id, request.item_id, request.gate))
        if request.partition_id == "stuck":
            await self.hold.wait()
        await send_json(send, 200, {"gate": 1} if request.gate == 0 else {"done": True})


@contextlib.asynccontextmanager
async def processors(directory: Path, *runs: tuple[str, list[str], int]
                     ) -> AsyncIterator[list[Processor]]:
    started = [await spawn(owner, ["run", "--owner-id", owner, "--health-port", str(port),
                                   *args], directory, health_port=port)
               for owner, args, port in runs]
    try:
        yield started
    except AssertionError as error:
        logs = "\n".join(f"--- {p.owner}:\n{p.stderr()[-2500:]}" for p in started)
        raise AssertionError(f"{error}\n{logs}") from None
    finally:
        codes = [await proc.terminate() for proc in started]
    assert codes == [0] * len(started), [p.stderr()[-2000:] for p in started]
    for proc in started:
        assert "Traceback" not in proc.stderr()


async def test_run_with_retention_cancel_and_backlog_gauges(migrated, tmp_path) -> None:
    """Two processors with --retention: one purges the old finished partitions, nothing
    live or recent is touched; `processor cancel` stops a partition a processor is running;
    /metrics shows the backlog."""
    db_url, prefix = migrated
    where = ["--db-url", db_url, "--table-prefix", prefix]
    handler = SelectiveHandler()
    clock = FixedClock(_utc_now())
    aged = Store.open(db_url, prefix, clock=clock)
    try:
        old = _utc_now() - timedelta(days=3)
        for n in range(4):
            await _aged(aged, clock, f"old-{n}", "complete", at=old, items=n + 1)
        await _aged(aged, clock, "old-failed", "failed", at=old, items=2)
        await _aged(aged, clock, "recent", "complete", at=_utc_now() - timedelta(hours=1),
                    items=2)
    finally:
        await aged.close()
    async with AsyncClient(db_url, prefix) as client, serve_app(handler) as base_url:
        await client.create_partition("stuck", [NewItem(f"s{n}", b"") for n in range(3)])
        await client.create_partition("live", [NewItem(f"l{n}", b"") for n in range(6)])
        common = ["--handler-url", f"{base_url}/", *where, *FAST, "--retention", "2d",
                  "--retention-interval", "0.2", "--backlog-interval", "0.2"]
        port = free_port()
        async with processors(tmp_path, ("ops-a", common, port), ("ops-b", common, 0)) as procs:
            await wait_until(lambda: _ids(client, lambda ids: not any(
                f"old-{n}" in ids for n in range(4))), timeout=30,
                message="the old complete partitions purged")
            assert (await client.wait("live", timeout=30)).counts == {"complete": 12 // 2}
            # (The processors may pass it between them first: a steal re-sends its calls.)
            await wait_until(lambda: len(_stuck(handler)) >= 3, timeout=20,
                             message="the stuck partition's calls in flight")
            # In a thread: the handler, on this event loop, goes on answering meanwhile.
            said = ok(await asyncio.to_thread(run_cli, "cancel", "stuck", *where))
            assert said.startswith("cancelled partition 'stuck' at gate 0")
            owner = (await client.partition("stuck")).owner  # its holder when cancelled
            holder = next(p for p in procs if p.owner == owner)
            await holder.wait_log("action=partition_stopped partition=stuck", timeout=5)
            await asyncio.sleep(0.2)  # calls sent before the holder let go have arrived
            called = len(_stuck(handler))
            handler.hold.set()
            samples = await wait_until(lambda: _gauges(procs[0], cancelled=1.0), timeout=10,
                                       message="the backlog gauges")
            assert samples['statefeed_partitions{status="failed"}'] == 1.0
            assert samples['statefeed_partitions{status="complete"}'] == 2.0  # recent, live
            assert samples["statefeed_items_waiting"] == 0.0
        purged = [p for p in procs if "action=retention_purged" in p.stderr()]
        assert len(purged) == 1, "one processor purged"
        line = next(line for line in purged[0].stderr().splitlines()
                    if "action=retention_purged" in line)
        assert "partitions=4 items=10 older_than=2d statuses=complete,cancelled" in line
        assert len(_stuck(handler)) == called, "nothing of it dispatched after the cancel"
        assert {call[2] for call in _stuck(handler)} == {0}
        left = {info.id: info for info in await client.partitions()}
        assert set(left) == {"old-failed", "recent", "stuck", "live"}
        assert left["stuck"].status == "cancelled" and left["stuck"].counts == {"available": 3}


def _stuck(handler: SelectiveHandler) -> list[tuple[str, str, int]]:
    return [call for call in handler.calls if call[0] == "stuck"]


async def _ids(client: AsyncClient, test: Any) -> bool:
    return test({info.id for info in await client.partitions()})


async def _gauges(proc: Processor, **wanted: float) -> dict[str, float] | None:
    samples = await proc.metrics()
    for status, value in wanted.items():
        if samples.get(f'statefeed_partitions{{status="{status}"}}') != value:
            return None
    return samples
