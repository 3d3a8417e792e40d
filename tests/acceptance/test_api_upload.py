"""``processor api`` as a real subprocess: a 100,000-item NDJSON create in bounded memory,
and a client cut off mid-stream that retries with its key and gets exactly one partition
of exactly 100,000 items."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from processor import AsyncClient
from tests.acceptance.harness.processes import START_DEADLINE, Processor, run_cli, spawn
from tests.support.engine import wait_until
from watcher.store.db.migrate import downgrade

ITEMS = 100_000
DATA_CHARS = 1000  # ~105 MB of NDJSON in all: far more than the API may hold
KEY = "upload-7f3a"
# The most the API's resident memory may grow while it takes the whole upload.
RSS_GROWTH_LIMIT = 80 * 1024 * 1024


@pytest.fixture
def migrated(db_url: str) -> Iterator[tuple[str, str]]:
    prefix = f"api{uuid.uuid4().hex[:8]}_"
    done = run_cli("migrate", "--db-url", db_url, "--table-prefix", prefix)
    assert done.returncode == 0, done.stderr
    yield db_url, prefix
    downgrade(db_url, prefix)


@contextlib.asynccontextmanager
async def api_process(tmp_path: Path, db_url: str, prefix: str
                      ) -> AsyncIterator[tuple[Processor, str]]:
    proc = await spawn("api", ["api", "--db-url", db_url, "--table-prefix", prefix,
                               "--port", "0"], tmp_path)
    try:
        def announced() -> str | None:
            assert proc.running, proc.stderr()
            found = re.search(r"(http://127\.0\.0\.1:\d+/)v1/", proc.output())
            return found.group(1) if found else None

        yield proc, await wait_until(announced, timeout=START_DEADLINE,
                                      message="the API's address")
    finally:
        code = await proc.terminate()
        assert code == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()


def line(number: int) -> bytes:
    return (json.dumps({"id": f"resume-{number:06}", "data": {"n": number,
                                                              "text": "x" * DATA_CHARS}})
            + "\n").encode()


async def body(count: int = ITEMS) -> AsyncIterator[bytes]:
    """The NDJSON body, about 1 MB per chunk, made as it is sent."""
    for start in range(0, count, 1000):
        yield b"".join(line(number) for number in range(start, min(count, start + 1000)))


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of a process, in bytes."""
    fields = {}
    for text in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = text.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


async def cut_off_midway(url: str, lines: int) -> None:
    """Send the headers and ``lines`` lines of a chunked create, then close the socket."""
    host, port = re.match(r"http://([\d.]+):(\d+)/", url).groups()  # type: ignore[union-attr]
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"PUT /v1/partitions/inbox HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n"
                 + f"Idempotency-Key: {KEY}\r\n\r\n".encode())
    async for chunk in body(lines):
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize("db_url", ["sqlite", pytest.param("postgres",
                                                           marks=pytest.mark.postgres)],
                         indirect=True)
async def test_a_cut_off_upload_leaves_nothing_and_its_retry_makes_one_partition(
        tmp_path: Path, migrated: tuple[str, str]) -> None:
    db_url, prefix = migrated
    async with api_process(tmp_path, db_url, prefix) as (proc, url), \
            httpx.AsyncClient(base_url=url, timeout=300) as http, \
            AsyncClient(db_url, prefix) as client:
        await cut_off_midway(url, ITEMS // 2)
        await proc.wait_log("action=api_request_abandoned")
        assert (await http.get("/v1/partitions/inbox")).status_code == 404
        assert await client.partitions() == []

        before = memory(proc.pid)
        created = await http.put("/v1/partitions/inbox?reduce_gates=1", content=body(),
                                 headers={"content-type": "application/x-ndjson",
                                          "idempotency-key": KEY})
        after = memory(proc.pid)
        assert created.status_code == 201, created.text
        assert created.json()["items"] == ITEMS
        growth = after["VmHWM"] - before["VmRSS"]
        print(f"\nAPI memory for a {ITEMS:,}-item NDJSON create of ~"
              f"{ITEMS * len(line(0)) / 1e6:.0f} MB: resident {before['VmRSS'] / 1e6:.0f} MB "
              f"before, peak {after['VmHWM'] / 1e6:.0f} MB (+{growth / 1e6:.0f} MB)")
        assert growth < RSS_GROWTH_LIMIT, "the upload was held in memory"

        again = await http.put("/v1/partitions/inbox?reduce_gates=1", content=body(),
                               headers={"content-type": "application/x-ndjson",
                                        "idempotency-key": KEY})
        assert again.status_code == 201 and again.json() == created.json()
        assert again.headers["idempotent-replayed"] == "true"
        assert [info.id for info in await client.partitions()] == ["inbox"]
        info = await client.partition("inbox")
        assert (info.counts, info.reduce_gates) == ({"available": ITEMS}, (1,))
