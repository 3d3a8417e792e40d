"""The handlers' test kit (:mod:`processor.testing`): a handler app against a real engine
on a throwaway SQLite database whose clock the test moves; the calls-twice mode; and the
pytest plugin, as a user's test file uses it."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

import handlers
from processor.testing import HandlerKit, KitError, NotIdempotentError

pytest_plugins = ["pytester"]

START = datetime(2030, 1, 7, 9, 0, 0)
WEEK = 7 * 86400


def ask(item: handlers.Item) -> handlers.Result:
    """Park for a week; the answer's own policy says what its deadline does."""
    policy = item.json().get("on_timeout", "retry")
    return handlers.Result(wait={"timeout": WEEK, "on_timeout": policy},
                           data=item.json())


def file_it(item: handlers.Item) -> handlers.Result:
    return handlers.Result(done=True, data={**item.json(), "filed": True})


APPROVALS = handlers.app({0: ask, 1: file_it})


async def test_a_week_long_wait_times_out_when_the_clock_moves_a_week() -> None:
    started = time.monotonic()
    async with HandlerKit(APPROVALS, start=START) as kit:
        await kit.create("contracts", {"c1": {"on_timeout": "fail"}})
        parked = await kit.run_until_idle("contracts")
        history = await kit.history("contracts")
        assert (parked.status, history.statuses()) == ("available", {"c1": "waiting"})
        assert history.items["c1"].retry_at == START + timedelta(days=7)

        advanced = time.monotonic()
        kit.advance(days=7)
        ended = await kit.run_until_done("contracts")
        history = await kit.history("contracts")
    done = time.monotonic()
    print(f"a 7-day wait timed out {done - advanced:.3f} s (wall) after the clock moved; "
          f"the whole test, the kit's start and stop included, took {done - started:.3f} s")
    assert ended.status == "failed"
    assert history.statuses() == {"c1": "failed"}
    assert history.errors() == {"c1": ["timed out waiting after 604800 s"]}
    assert history.items["c1"].error_history[0].at == START + timedelta(days=7)


async def test_a_wait_that_retries_on_timeout_is_called_again_and_parks_again() -> None:
    async with HandlerKit(APPROVALS, start=START) as kit:
        await kit.create("contracts", {"c1": {}})
        await kit.run_until_idle("contracts")
        kit.advance(days=6, hours=23)
        await kit.run_until_idle("contracts")
        assert (await kit.history("contracts")).items["c1"].attempts == 0  # not yet due
        kit.advance(hours=1)
        await kit.run_until_idle("contracts")
        item = (await kit.history("contracts")).items["c1"]
        # The timeout spent an attempt; the handler was called again after its backoff
        # (which the kit skipped) and parked again, a week on.
        assert (item.status, item.attempts) == ("waiting", 1)
        assert [(entry.at, entry.error) for entry in item.error_history] == [
            (START + timedelta(days=7), "timed out waiting after 604800 s")]
        assert item.retry_at is not None
        assert timedelta(0) < item.retry_at - START - timedelta(days=14) < timedelta(seconds=1)
        with pytest.raises(KitError, match="'c1' waits for a completion, deadline 2030-01-21"):
            await kit.run_until_done("contracts")


async def test_a_parked_item_completed_by_the_test_runs_its_next_gate() -> None:
    async with HandlerKit(APPROVALS, start=START) as kit:
        await kit.create("contracts", {"c1": {"approver": "ada"}, "c2": {"approver": "alan"}})
        await kit.run_until_idle("contracts")
        done = await kit.complete("contracts", "c1", {"gate": 1})
        assert (done.status, done.gate) == ("available", 1)
        with pytest.raises(KitError, match=r"stopped before it ended: it is idle.*'c2' waits"):
            await kit.run_until_done("contracts")
        await kit.complete("contracts", "c2", {"gate": 1, "data": {"approver": "alan",
                                                                   "note": "ok"}})
        ended = await kit.run_until_done("contracts")
        history = await kit.history("contracts")
    assert ended.status == "complete"
    assert {item_id: item.data for item_id, item in history.items.items()} == {
        "c1": b'{"approver":"ada","filed":true}',
        "c2": b'{"approver":"alan","note":"ok","filed":true}'}


def unpack(item: handlers.Item) -> handlers.Result:
    """Gate 0: the inbox spawns a resume per line; each resume goes on to gate 1."""
    if item.id == "inbox":
        lines = item.text().splitlines()
        return handlers.Result(done=True, spawn=[handlers.Spawn(f"r{n}", line.encode())
                                                 for n, line in enumerate(lines)])
    return handlers.Result(gate=1, data={"words": len(item.text().split())})


def total(page: handlers.ReducePage) -> handlers.Reduced:
    return handlers.Reduced(result={"words": sum(item.json()["words"] for item in page.items),
                                    "resumes": len(page.items)})


async def test_a_spawn_and_reduce_pipeline_runs_to_its_end_with_its_history() -> None:
    async with HandlerKit(handlers.app({0: unpack}, reduce=total)) as kit:
        await kit.create("inbox-1", {"inbox": "ada lovelace\nalan mathison turing\ngrace"},
                         reduce_gates=[1])
        at_reduce = await kit.run_to_gate("inbox-1", 1)
        assert at_reduce.gate == 1
        ended = await kit.run_until_done("inbox-1")
        history = await kit.history("inbox-1")
    assert (ended.status, ended.result_json()) == ("complete", {"words": 6, "resumes": 3})
    assert history.statuses() == dict.fromkeys(["inbox", "r0", "r1", "r2"], "complete")
    assert {item.id: (item.parent, item.gate) for item in history.items.values()} == {
        "inbox": (None, 0), "r0": ("inbox", 1), "r1": ("inbox", 1), "r2": ("inbox", 1)}
    assert history.errors() == {}


async def test_a_retry_backoff_passes_on_the_clock_not_the_wall() -> None:
    failed: set[str] = set()

    def flaky(item: handlers.Item) -> handlers.Result:
        if item.id not in failed:
            failed.add(item.id)
            raise RuntimeError("the service hiccuped")
        return handlers.Result(done=True)

    # The production backoff: 30 s of the database clock, which the kit skips.
    async with HandlerKit(handlers.app(flaky), start=START,
                          config={"retry_backoff": 30.0, "retry_backoff_max": 60.0}) as kit:
        await kit.create("p", {"a": "x", "b": "y"})
        ended = await kit.run_until_done("p", timeout=20)
        history = await kit.history("p")
        assert kit.now() - START >= timedelta(seconds=15)  # a jittered 30 s backoff
    assert ended.status == "complete"
    hiccup = "the handler answered HTTP 500: RuntimeError: the service hiccuped"
    assert history.errors() == {"a": [hiccup], "b": [hiccup]}
    failed.clear()
    async with HandlerKit(handlers.app(flaky)) as kit:
        await kit.create("q", {"a": "x"})
        with pytest.raises(KitError, match=r"it is idle: .*item 'a' is delayed until"):
            await kit.run_to_gate("q", 1, skip_delays=False)
        with pytest.raises(KitError, match=r"before it reached gate 1: it ended: "
                                           r"partition 'q' is complete at gate 0"):
            await kit.run_to_gate("q", 1)


def numbered() -> handlers.HandlerApp:
    calls = 0

    def step(item: handlers.Item) -> handlers.Result:
        nonlocal calls
        calls += 1
        return handlers.Result(done=True, data={"call": calls})  # differs on a repeat

    return handlers.app(step)


def words(item: handlers.Item) -> handlers.Result:
    return handlers.Result(done=True, data={"words": len(item.text().split())})


async def test_calls_twice_catches_a_handler_that_answers_a_repeat_differently() -> None:
    with pytest.raises(NotIdempotentError) as caught:
        async with HandlerKit(numbered(), calls_twice=True) as kit:
            await kit.create("p", {"a": "x", "b": "y", "c": "z"})
            assert (await kit.run_until_done("p")).status == "complete"
    findings = caught.value.findings
    assert sorted(finding.item_id for finding in findings) == ["a", "b", "c"]
    assert "item 'a' gate 0: answer differs" in str(caught.value)


async def test_calls_twice_passes_an_idempotent_handler_and_shuffles_the_copies() -> None:
    seen: list[tuple[str, str]] = []

    async def record(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            seen.append((headers[b"x-item-id"].decode(),
                         headers[b"idempotency-key"].decode()))
        await inner(scope, receive, send)

    inner = handlers.app(words)
    async with HandlerKit(record, calls_twice=True, seed=3) as kit:
        await kit.create("p", {f"i{n}": "a b c" for n in range(6)})
        assert (await kit.run_until_done("p")).status == "complete"
        assert kit.findings == []
    # Every call went twice, with one key per item, and not each copy after its twin.
    assert sorted({item_id for item_id, _ in seen}) == [f"i{n}" for n in range(6)]
    assert all(len({key for i, key in seen if i == item_id}) == 1 and
               sum(i == item_id for i, _ in seen) == 2 for item_id, _ in seen)
    assert any(seen[n][0] != seen[n + 1][0] for n in range(0, len(seen), 2))


USER_TEST = '''
import asyncio

import handlers

def step(item):
    return handlers.Result(done=True, data={"n": COUNT.pop()})

COUNT = list(range(100))
APP = handlers.app(step)

def test_the_pipeline_completes(statefeed):
    async def main():
        async with statefeed(APP) as kit:
            await kit.create("p", {"a": "x"})
            info = await kit.run_until_done("p")
            assert info.status == "complete"
            assert (await kit.history("p")).statuses() == {"a": "complete"}
    asyncio.run(main())
'''


def test_the_pytest_plugin_gives_a_kit_and_a_calls_twice_switch(
        pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_user=USER_TEST)
    plain = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")
    plain.assert_outcomes(passed=1)
    twice = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist",
                               "--statefeed-calls-twice")
    twice.assert_outcomes(failed=1)
    twice.stdout.fnmatch_lines(["*NotIdempotentError*", "*item 'a' gate 0: answer differs*"])
