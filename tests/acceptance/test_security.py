"""Security from the outside: secrets stay out of logs and errors, TLS is verified,
names are validated, and a handler's answer is data, never code or SQL.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import uuid

import pytest

from processor import NewItem
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.database import closed_port, postgres_address, via
from tests.acceptance.harness.handler import Call, RecordingHandler, initial_data
from tests.acceptance.harness.processes import run_cli
from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.servers import serve_app

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

COLUMN_GATE_LIMIT = 2**31 - 1  # gates are INTEGER columns


@pytest.fixture(autouse=True)
def _postgres() -> None:
    require_postgres()


def secret() -> str:
    return f"s3cret-{uuid.uuid4().hex}"


def assert_clean(text: str, *secrets: str) -> None:
    for value in secrets:
        assert value not in text, f"secret {value!r} leaked:\n{text[-4000:]}"


# --------------------------------------------------------------------------- secrets


async def test_database_password_is_never_logged(tmp_path) -> None:
    """A password in the database URL stays out of the logs at debug level, of
    /readyz and /metrics, whether the database answers or not.
    """
    password = secret()
    handler = RecordingHandler(gates=2, passes=1)
    async with Cluster(tmp_path, handler) as cluster:
        layout = await cluster.create(2, 2)
        # Trust authentication accepts any password, so this one really connects.
        working = await cluster.start("working", "--log-level", "debug", health=True,
                                      db_url=via(POSTGRES_URL, postgres_address()[1],
                                                 password=password))
        failing = await cluster.start("failing", "--log-level", "debug", health=True,
                                      db_url=via(POSTGRES_URL, closed_port(), password=password))
        await cluster.wait_settled(layout, timeout=30)
        await failing.wait_log("action=database_wait")
        pages = [(await proc.get(path)).text for proc in (working, failing)
                 for path in ("/readyz", "/metrics")]
        assert await working.terminate() == 0
        assert await failing.terminate() == 0
        shown = run_cli("status", "--db-url", via(POSTGRES_URL, postgres_address()[1],
                                                  password=password),
                        "--table-prefix", cluster.prefix)
        assert shown.returncode == 0, shown.stderr
        outputs = [working.output(), failing.output(), shown.stdout + shown.stderr, *pages]
    assert " DEBUG " in outputs[0] and "action=partition_closed" in outputs[0]
    for text in outputs:
        assert_clean(text, password)


async def test_handler_secrets_are_never_logged(tmp_path) -> None:
    """An Authorization header and a key in the handler URL's query stay out of the
    logs (at debug, with failing calls) and out of the stored errors, even when
    the handler echoes them back in its error messages.
    """
    token, code = secret(), secret()

    def echo(call: Call):
        seen = f"{call.headers.get('authorization')} {call.headers.get('x-code', '')}"
        if call.item_id == "echo":
            return 500, {"error": {"message": f"bad credentials: {seen} code={code}"}}
        if call.item_id == "refused":
            return 403, {"error": {"message": f"forbidden for {seen}"}}
        if call.item_id == "garbage":
            return 200, f"not json, token {token}, code {code}".encode()
        return None

    handler = RecordingHandler(gates=1, passes=1, respond=echo)
    async with Cluster(tmp_path, handler) as cluster:
        ids = ["echo", "refused", "garbage", "fine"]
        await cluster.client.create_partition(
            "auth", [NewItem(item_id, initial_data()) for item_id in ids])
        proc = await cluster.start(
            "authed", "--log-level", "debug", "--max-retries", "1", health=True,
            handler_url=f"{cluster.base_url}/p/authed?code={code}",
            env={"PROCESSOR_HANDLER_HEADER": f"Authorization: Bearer {token}"})
        await cluster.wait_settled(["auth"], timeout=30)
        items = {item.id: item for item in await cluster.client.items("auth")}
        metrics = (await proc.get("/metrics")).text
        assert await proc.terminate() == 0
        output = proc.output()
    assert {call.headers.get("authorization") for call in handler.calls} == {f"Bearer {token}"}
    assert items["fine"].status == "complete"
    for item_id in ("echo", "refused", "garbage"):
        assert items[item_id].status == "failed", items[item_id]
        assert_clean(items[item_id].last_error or "", token, code)
    assert "handler_call_failed" in output, "debug logging was on and calls failed"
    assert_clean(output + metrics, token, code)


# --------------------------------------------------------------------------- TLS


async def test_tls_verification_is_on_by_default(tmp_path) -> None:
    """An https handler URL that reaches a plain-HTTP port fails the attempt with a
    TLS error instead of talking in the clear.
    """
    handler = RecordingHandler(gates=1, passes=1)
    async with Cluster(tmp_path, handler) as cluster:
        await cluster.create(1, 1)
        https = cluster.base_url.replace("http://", "https://")
        await cluster.start("tls", "--max-retries", "1", handler_url=f"{https}/p/tls")
        infos = await cluster.wait_settled(["part000"], timeout=30)
        [item] = await cluster.client.items("part000")
    assert infos["part000"].status == "failed"
    assert item.status == "failed"
    assert "ssl" in item.last_error.lower() or "tls" in item.last_error.lower(), item.last_error
    assert handler.calls == [], "no request may reach the handler over plain HTTP"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_self_signed_certificates_need_a_ca_bundle(tmp_path) -> None:
    """A self-signed handler certificate is refused by default and accepted with
    ``--ca-bundle`` naming it.
    """
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = await asyncio.to_thread(
        subprocess.run,
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    handler = RecordingHandler(gates=1, passes=1)
    async with (Cluster(tmp_path) as cluster,
               serve_app(handler, certfile=cert, keyfile=key) as base_url):
        await cluster.client.create_partition("refused", [NewItem("a", initial_data())])
        refusing = await cluster.start("refusing", "--max-retries", "0",
                                       handler_url=f"{base_url}/p/refusing")
        await cluster.wait_settled(["refused"], timeout=30)
        [item] = await cluster.client.items("refused")
        assert item.status == "failed"
        assert "certificate" in item.last_error.lower(), item.last_error
        assert await refusing.terminate() == 0
        await cluster.client.create_partition("trusted", [NewItem("a", initial_data())])
        await cluster.start("trusting", "--ca-bundle", str(cert),
                            handler_url=f"{base_url}/p/trusting")
        infos = await cluster.wait_settled(["trusted"], timeout=30)
    assert infos["trusted"].status == "complete"
    assert [call.caller for call in handler.calls] == ["trusting"]


def test_a_missing_ca_bundle_is_a_configuration_error(tmp_path) -> None:
    done = run_cli("run", "--handler-url", "https://127.0.0.1:9/", "--health-port", "0",
                   "--db-url", f"sqlite:///{tmp_path / 'x.db'}",
                   "--ca-bundle", str(tmp_path / "missing.pem"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing.pem" in lines[0] and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- names


async def test_table_prefix_is_validated(tmp_path) -> None:
    """A prefix that is not a plain identifier is refused (exit 2, one line) before
    anything touches the database.
    """
    async with Cluster(tmp_path) as cluster:
        canary = f"{cluster.prefix}canary"
        await cluster.db.query(f"CREATE TABLE {canary} (id int)")
        hostile = [f"x; drop table {canary}; --", f'x" ; drop table {canary}', "X_upper",
                   "a" * 31]
        runs = [
            asyncio.to_thread(run_cli, "run", "--handler-url", "http://127.0.0.1:9/",
                              "--health-port", "0", "--migrate", "--db-url", POSTGRES_URL,
                              "--table-prefix", prefix)
            for prefix in hostile
        ] + [asyncio.to_thread(run_cli, command, "--db-url", POSTGRES_URL, "--table-prefix",
                               hostile[0]) for command in ("migrate", "status")]
        for done in await asyncio.gather(*runs):
            assert done.returncode == 2, (done.args, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and "table prefix" in lines[0], done.stderr
        assert await cluster.db.query(f"SELECT count(*) FROM {canary}") == [(0,)]
        await cluster.db.query(f"DROP TABLE {canary}")


# --------------------------------------------------------------------------- answers


async def test_handler_answers_are_data_never_code(tmp_path) -> None:
    """SQL, shell syntax and odd gates in a handler's answer are stored verbatim or
    refused; nothing runs, and no table but the processor's own is touched.
    """
    marker = tmp_path / "pwned"
    async with Cluster(tmp_path) as cluster:
        canary = f"{cluster.prefix}canary"
        await cluster.db.query(f"CREATE TABLE {canary} (id int, note text)")
        await cluster.db.query(f"INSERT INTO {canary} VALUES (1, 'intact')")
        items_table = f"{cluster.prefix}items"
        hostile = {
            "sql": f"'); DROP TABLE {canary}; DELETE FROM {items_table}; --",
            "quote": f'"; UPDATE {canary} SET note = \'owned\'; --',
            "shell": f"$(touch {marker}) `touch {marker}`; touch {marker}",
            "nul": "nul \u0000 byte and unicode \u2603",
        }
        raw = b"\x00\xff'); DROP TABLE " + canary.encode() + b"; --\x00"
        sneaky_partition = f"p'); DROP TABLE {canary}; --"
        sneaky_item = f'i"); DELETE FROM {items_table}; --'
        answers = {
            "sql": (200, {"done": True, "data": hostile}),
            "binary": (200, {"done": True, "data_b64": base64.b64encode(raw).decode()}),
            "largest": (200, {"gate": 2**31 - 1, "done": True}),
            "overflow": (200, {"gate": 2**63}),
            "negative": (200, {"gate": -1}),
            "typed": (200, {"gate": f"1; DROP TABLE {canary}"}),
            "backwards": (200, {"gate": 0}),
            sneaky_item: (200, {"done": True, "data": {"id": sneaky_item}}),
        }
        handler = RecordingHandler(respond=lambda call: answers[call.item_id])
        async with serve_app(handler) as base_url:
            await cluster.client.create_partition(
                "answers", [NewItem(item_id, b"{}") for item_id in ("sql", "binary", "largest")])
            for item_id in ("overflow", "negative", "typed"):
                await cluster.client.create_partition(item_id, [NewItem(item_id, b"{}")])
            await cluster.client.create_partition("backwards",
                                                  [NewItem("backwards", b"{}", gate=1)])
            await cluster.client.create_partition(sneaky_partition, [NewItem(sneaky_item, b"")])
            await cluster.start("answers", "--max-retries", "1", handler_url=f"{base_url}/p/a")
            ids = ["answers", "overflow", "negative", "typed", "backwards", sneaky_partition]
            infos = await cluster.wait_settled(ids, timeout=30)
            items = {(item.partition_id, item.id): item for item in await cluster.items(ids)}
            no_tracebacks = "Traceback" not in cluster.processors[0].output()
        assert await cluster.db.query(f"SELECT id, note FROM {canary}") == [(1, "intact")]
        assert sorted(await cluster.db.query(
            "SELECT table_name FROM information_schema.tables "
            "WHERE left(table_name, :n) = :prefix ORDER BY table_name",
            n=len(cluster.prefix), prefix=cluster.prefix)) == sorted(
            [(f"{cluster.prefix}{name}",) for name in
             ("alembic_version", "canary", "flow_controls", "flow_grants", "items", "leaders",
              "notifications", "partition_timelines", "partitions", "processors",
              "removed_waits", "schedules", "waits")])
        await cluster.db.query(f"DROP TABLE {canary}")
    assert no_tracebacks
    assert not marker.exists()
    assert items["answers", "sql"].data == json.dumps(
        hostile, separators=(",", ":"), ensure_ascii=False).encode()
    assert items["answers", "binary"].data == raw
    assert items["answers", "largest"].gate == 2**31 - 1
    assert infos["answers"].status == "complete"
    assert infos[sneaky_partition].status == "complete"
    assert json.loads(items[sneaky_partition, sneaky_item].data) == {"id": sneaky_item}
    assert [call.partition_id for call in handler.calls if call.item_id == sneaky_item] == [
        sneaky_partition]
    for name in ("overflow", "negative", "typed", "backwards"):
        item = items[name, name]
        assert infos[name].status == "failed" and item.status == "failed", item
        assert "gate" in item.last_error, item.last_error
        assert item.data == b"{}"
    assert items["backwards", "backwards"].attempts == 1, "a gate below the partition's is final"


async def test_a_gate_beyond_the_column_range_does_not_wedge_the_processor(tmp_path) -> None:
    """A handler answers a gate one past what the gate column holds. The item fails
    with an error naming the gate, and the processor's other partitions keep going.
    """
    def respond(call: Call):
        if call.item_id == "huge":
            return 200, {"gate": COLUMN_GATE_LIMIT + 1}
        return None

    handler = RecordingHandler(gates=2, passes=2, respond=respond, delay=0.05)
    async with Cluster(tmp_path, handler) as cluster:
        await cluster.client.create_partition("huge", [NewItem("huge", b"{}")])
        layout = await cluster.create(3, 2)
        proc = await cluster.start("only", "--max-retries", "1")
        infos = await cluster.wait_settled(["huge", *layout], timeout=8)
        [huge] = await cluster.client.items("huge")
        log = proc.stderr()
    assert all(infos[pid].status == "complete" for pid in layout)
    assert huge.status == "failed" and huge.gate == 0, huge
    assert "gate" in (huge.last_error or "") and str(COLUMN_GATE_LIMIT) in huge.last_error
    assert "result_write_failed" not in log
