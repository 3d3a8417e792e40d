"""Synced writes made together share one commit (watcher.store.drivers.sqlite.shared_commits):
the grouping and the cancellations, with a recording group writer; SQLite's side of
it, on a real file, is in tests/databases/test_sqlite.py."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.engine import wait_until
from watcher.store.drivers.sqlite.shared_commits import SharedCommits, Write, commit_group, sync_log


class Recorder:
    """A group writer that notes each group and answers each write's own outcome: the
    value of its parameter ``n``, or the error it names."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, writes: Sequence[Write]) -> list[int | BaseException]:
        self.groups.append([sql for sql, _ in writes])
        await self.release.wait()
        return [ValueError(values["error"]) if "error" in values else values["n"]
                for _, values in writes]


async def test_writes_made_in_one_turn_share_a_group_and_later_ones_the_next() -> None:
    recorder = Recorder()
    shared = SharedCommits(recorder)
    recorder.release.clear()
    first = [asyncio.create_task(shared.execute(f"w{n}", {"n": n})) for n in range(3)]
    await wait_until(lambda: recorder.groups, message="the first group to start")
    late = [asyncio.create_task(shared.execute(f"late{n}", {"n": 10 + n})) for n in range(2)]
    await wait_until(lambda: len(shared._waiting) == 2, message="the late writes to queue")
    recorder.release.set()
    assert await asyncio.gather(*first, *late) == [0, 1, 2, 10, 11]
    assert recorder.groups == [["w0", "w1", "w2"], ["late0", "late1"]]


async def test_each_caller_gets_its_own_writes_error() -> None:
    shared = SharedCommits(Recorder())
    outcomes = await asyncio.gather(shared.execute("a", {"n": 1}),
                                    shared.execute("b", {"error": "refused"}),
                                    return_exceptions=True)
    assert outcomes[0] == 1
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "refused"


async def test_a_write_cancelled_before_its_group_starts_is_dropped() -> None:
    recorder = Recorder()
    shared = SharedCommits(recorder)
    recorder.release.clear()
    blocker = asyncio.create_task(shared.execute("blocker", {"n": 0}))
    await wait_until(lambda: recorder.groups, message="the first group to start")
    kept = asyncio.create_task(shared.execute("kept", {"n": 1}))
    dropped = asyncio.create_task(shared.execute("dropped", {"n": 2}))
    await wait_until(lambda: len(shared._waiting) == 2, message="both writes to queue")
    dropped.cancel()
    await wait_until(lambda: len(shared._waiting) == 1, message="the cancelled write to leave")
    recorder.release.set()
    assert (await blocker, await kept) == (0, 1)
    with pytest.raises(asyncio.CancelledError):
        await dropped
    assert recorder.groups == [["blocker"], ["kept"]]


async def test_a_write_whose_group_started_is_written_though_its_caller_left() -> None:
    recorder = Recorder()
    shared = SharedCommits(recorder)
    recorder.release.clear()
    left = asyncio.create_task(shared.execute("left", {"n": 1}))
    stays = asyncio.create_task(shared.execute("stays", {"n": 2}))
    await wait_until(lambda: recorder.groups, message="the group to start")
    left.cancel()
    recorder.release.set()
    assert await stays == 2
    with pytest.raises(asyncio.CancelledError):
        await left
    assert recorder.groups == [["left", "stays"]]
    await shared.wait_idle()


def test_commit_group_writes_all_or_none(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT NOT NULL)")
    conn.executemany("INSERT INTO t VALUES (?, 'old')", [("a",), ("b",)])
    update = "UPDATE t SET v = :v WHERE id = :id"
    assert commit_group(conn, [(update, {"id": "a", "v": "new"}),
                               (update, {"id": "zz", "v": "new"})]) == [1, 0]
    with pytest.raises(sqlite3.IntegrityError):
        commit_group(conn, [(update, {"id": "b", "v": "new"}), (update, {"id": "a", "v": None})])
    assert dict(conn.execute("SELECT id, v FROM t")) == {"a": "new", "b": "old"}
    assert not conn.in_transaction


def test_commit_group_with_full_sync_goes_back_to_normal(tmp_path: Path) -> None:
    """For a database whose log cannot be synced on its own, the commit syncs itself."""
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT NOT NULL)")
    sent: list[str] = []
    conn.set_trace_callback(sent.append)
    assert commit_group(conn, [("INSERT INTO t VALUES ('a', 'x')", {})], full_sync=True) == [1]
    assert sent[0] == "PRAGMA synchronous=FULL" and sent[-1] == "PRAGMA synchronous=NORMAL"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1


def test_sync_log_syncs_the_file_it_names_and_says_when_it_cannot(tmp_path: Path) -> None:
    log = tmp_path / "t.db-wal"
    log.write_bytes(b"frames")
    sync_log(str(log))  # a real file: synced, nothing raised
    with pytest.raises(FileNotFoundError):
        sync_log(str(tmp_path / "absent.db-wal"))


def test_a_write_is_followed_only_where_it_matched_and_by_the_first_follower_that_matches(
        tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "followed.db", isolation_level=None)
    conn.execute("CREATE TABLE p (id TEXT PRIMARY KEY, version INTEGER)")
    conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, text TEXT)")
    conn.executemany("INSERT INTO p VALUES (?, 1)", [("a",), ("b",), ("c",)])
    conn.execute("INSERT INTO t VALUES ('a', 'old')")

    def moved(pid: str, seen: int) -> Write:
        row = {"id": pid, "text": f"{pid}-new"}
        return ("UPDATE p SET version = version + 1 WHERE id = :id AND version = :seen",
                {"id": pid, "seen": seen},
                (("UPDATE t SET text = :text WHERE id = :id", row),
                 ("INSERT INTO t VALUES (:id, :text)", row)))

    # a: its timeline row is updated; b: it has none, so it is inserted; c: the move
    # misses (a stale version), so nothing follows it.
    assert commit_group(conn, [moved("a", 1), moved("b", 1), moved("c", 7)]) == [1, 1, 0]
    assert dict(conn.execute("SELECT id, text FROM t").fetchall()) == {
        "a": "a-new", "b": "b-new"}
    assert commit_group(conn, [moved("b", 2)]) == [1]  # alone, in a transaction too
    assert dict(conn.execute("SELECT id, text FROM t").fetchall())["b"] == "b-new"
    conn.close()
