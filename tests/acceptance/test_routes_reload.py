"""A routes file reloaded on SIGHUP by a real ``processor run --routes FILE`` process, on
every live database, with real uvicorn services: an invalid file is refused with the
routes in use kept; a valid one moves a pipeline to a new service and adds a pipeline,
new work goes by the new routes, and the calls in flight at the reload (to the service
the new file drops) finish and are written."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import FAST, spawn
from tests.support.engine import wait_until
from tests.support.pipelines import answered_by, every_gate, routes_text, serving
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(180)

BEFORE = every_gate(one="a")

# Pipeline one moves to service b (a is no longer named), and pipeline two is new.
AFTER = every_gate(one="b", two="b")


async def test_sighup_reloads_the_routes_without_dropping_a_call_in_flight(
        db_url: str, table_prefix: str, tmp_path: Path) -> None:
    path = tmp_path / "routes.toml"
    health_port = free_port()
    async with serving() as start, AsyncClient(db_url, table_prefix) as client:
        urls = await start("a", "b")
        a = urls["a"][0]
        gate1_open = a.hold(1)  # p1's gate 1 calls are in flight over the reload
        path.write_text(routes_text(BEFORE, urls))
        proc = await spawn("routed", [
            "run", "--routes", str(path), "--db-url", db_url, "--table-prefix", table_prefix,
            "--owner-id", "routed", "--health-host", "127.0.0.1", "--health-port",
            str(health_port), *FAST, "--request-timeout", "20"], tmp_path,
            health_port=health_port)
        try:
            await proc.wait_log("action=watcher_started")
            await client.create_partition("p1", [NewItem("i", b"{}"), NewItem("j", b"{}")],
                                          pipeline="one")
            await wait_until(lambda: a.in_flight("p1", 1) == 2, timeout=30,
                             message="p1's gate 1 calls in flight")

            path.write_text("[[pipeline]]\nname = 'one'\ncolour = 'red'\n")
            proc.process.send_signal(signal.SIGHUP)
            refused = await proc.wait_log("action=routes_refused")
            assert f"{path}:3: unknown key 'colour'" in refused, refused

            path.write_text(routes_text(AFTER, urls))
            proc.process.send_signal(signal.SIGHUP)
            reloaded = await proc.wait_log("action=routes_reloaded")
            assert "pipelines=one,two" in reloaded and "retired=1" in reloaded, reloaded
            gate1_open.set()  # the calls in flight to the dropped service end now
            await client.create_partition("p2", [NewItem("i", b"{}")], pipeline="one")
            await client.create_partition("p3", [NewItem("i", b"{}")], pipeline="two")
            for partition_id in ("p1", "p2", "p3"):
                info = await client.wait(partition_id, timeout=60)
                assert info.status == "complete", (partition_id, proc.stderr()[-3000:])
            assert await proc.terminate() == 0
        finally:
            proc.kill()
            await proc.process.wait()
        assert await answered_by(client, "p1") == {("0", "a"), ("1", "a")}
        assert await answered_by(client, "p2") == {("0", "b"), ("1", "b")}
        assert await answered_by(client, "p3") == {("0", "b"), ("1", "b")}
        assert all(item.attempts == 0 for item in await client.items("p1"))
    assert sorted(a.calls) == [("p1", 0), ("p1", 0), ("p1", 1), ("p1", 1)]  # each once
    assert "Traceback" not in proc.output(), proc.output()[-3000:]
