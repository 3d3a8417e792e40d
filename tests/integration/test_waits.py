"""Waits in library mode, on every live database: an answer parks its item at its gate
until a completion (exactly once), a timeout, or a cancel moves it on."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from processor import AsyncClient, NewItem
from tests.support.engine import running, wait_until
from watcher import Result, Wait, Watcher, WatcherConfig, WorkItem
from watcher.errors import AlreadyCompletedError, CompletionRefusedError, WaitNotFoundError
from watcher.protocol import NonRetryableError, RetryableError

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


def config(owner: str = "w1", **overrides: object) -> WatcherConfig:
    return WatcherConfig(**{"owner_id": owner, **FAST, **overrides})  # type: ignore[arg-type]


class Parker:
    """A processor that parks every item at gate 0 (remembering each call's token) and
    completes it at gate 1."""

    def __init__(self, timeout: float = 600.0, on_timeout: str | None = None, *,
                 gate: int = 0) -> None:
        self.tokens: dict[str, list[str]] = {}
        self.wait = Wait(timeout, on_timeout)
        self.gate = gate

    async def __call__(self, item: WorkItem) -> Result:
        if item.gate == self.gate:
            self.tokens.setdefault(item.id, []).append(item.completion_token)
            return Result(wait=self.wait, data=b'"parked"')
        return Result(done=True)

    def token(self, item_id: str) -> str:
        return self.tokens[item_id][-1]


async def _statuses(client: AsyncClient, partition_id: str) -> dict[str, str]:
    return {item.id: item.status for item in await client.items(partition_id)}


async def test_a_parked_gate_passes_once_every_wait_is_completed(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: len(parker.tokens) == 2, message="both parked")
        await wait_until(lambda: _all_waiting(client), message="both waiting")
        items = {item.id: item for item in await client.items("p")}
        assert items["a"].data == b'"parked"', "the parking answer's data is written"
        done = await store.wait_complete(parker.token("a"), Result(gate=1))
        assert (done.status, done.gate) == ("available", 1)
        with pytest.raises(AlreadyCompletedError):
            await store.wait_complete(parker.token("a"), Result(gate=1))
        info = await client.partition("p")
        assert info.status == "available" and info.gate == 0, "b still waits: gate 0 holds"
        await store.wait_complete(parker.token("b"), Result(gate=1))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 2}
    await client.close()


async def _all_waiting(client: AsyncClient) -> bool:
    return set((await _statuses(client, "p")).values()) == {"waiting"}


async def test_unknown_and_malformed_tokens_are_not_found(store) -> None:
    for token in ("x" * 43, "not a token!", "", "a" * 500):
        with pytest.raises(WaitNotFoundError):
            await store.wait_complete(token, Result(done=True))
        with pytest.raises(WaitNotFoundError):
            await store.wait_heartbeat(token, 10)


async def test_two_racing_completions_apply_exactly_once(db_url, table_prefix,
                                                         make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1")])
    stores = [make_store(), make_store()]
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _all_waiting(client), message="parked")
        token = parker.token("a")
        outcomes = await asyncio.gather(
            stores[0].wait_complete(token, Result(done=True, data=b'"one"')),
            stores[1].wait_complete(token, Result(done=True, data=b'"two"')),
            return_exceptions=True)
        info = await client.wait("p", timeout=30)
    won = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    lost = [outcome for outcome in outcomes if isinstance(outcome, AlreadyCompletedError)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    (item,) = await client.items("p")
    assert item.data == (b'"one"' if outcomes[0] is won[0] else b'"two"')
    assert info.status == "complete"
    await client.close()


async def test_a_completion_that_waits_again_gets_a_new_token(db_url, table_prefix,
                                                              make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _all_waiting(client), message="parked")
        first = parker.token("a")
        again = await store.wait_complete(first, Result(wait=Wait(600)))
        assert again.status == "waiting" and again.completion_token not in (None, first)
        with pytest.raises(AlreadyCompletedError):
            await store.wait_complete(first, Result(done=True))
        assert again.completion_token is not None
        await store.wait_complete(again.completion_token, Result(done=True))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    await client.close()


async def test_bad_completions_write_nothing_and_keep_the_token(db_url, table_prefix,
                                                                make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(gate=3)
    await client.create_partition("p", [NewItem("a", b"1", gate=3)])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: parker.tokens, message="parked")
        await wait_until(lambda: _all_waiting(client), message="waiting")
        token = parker.token("a")
        cases = [(Result(gate=1), "gate"), (Result(done=True, snooze=5), "snooze"),
                 (Result(wait=Wait(10**9)), "wait"),
                 (Result(spawn=[NewItem("", b"x")]), "spawn")]
        for answer, field in cases:
            with pytest.raises(CompletionRefusedError) as refused:
                await store.wait_complete(token, answer)
            assert refused.value.field == field, (answer, refused.value)
        assert await _statuses(client, "p") == {"a": "waiting"}
        await store.wait_complete(token, Result(done=True))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    await client.close()


async def test_an_error_completion_retries_then_fails(db_url, table_prefix,
                                                      make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _all_waiting(client), message="parked")
        retried = await store.wait_complete(parker.token("a"), RetryableError("later"))
        assert (retried.status, retried.attempts) == ("available", 1)
        await wait_until(lambda: len(parker.tokens["a"]) == 2, message="called again")
        failed = await store.wait_complete(parker.token("b"), NonRetryableError("refused"))
        assert failed.status == "failed" and failed.last_error == "refused"
        info = await client.wait("p", timeout=30)
    assert info.status == "failed"
    await client.close()


async def test_a_timeout_spends_an_attempt_and_calls_again(db_url, table_prefix,
                                                           make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=0.2)
    await client.create_partition("p", [NewItem("a", b"1")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config(max_retries=2))):
        await wait_until(lambda: len(parker.tokens.get("a", ())) >= 2, message="called again")
        with pytest.raises(AlreadyCompletedError):
            await store.wait_complete(parker.tokens["a"][0], Result(done=True))
        info = await client.wait("p", timeout=30)
    assert info.status == "failed", "retries ran out"
    assert len(parker.tokens["a"]) == 3
    (item,) = await client.items("p")
    assert item.last_error == "timed out waiting after 0.2 s"
    assert item.attempts == 3
    await client.close()


async def test_the_fail_policy_fails_at_the_first_timeout(db_url, table_prefix,
                                                          make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=0.1, on_timeout="fail")
    await client.create_partition("p", [NewItem("a", b"1")])
    async with running(Watcher(make_store(), parker, config())):
        info = await client.wait("p", timeout=30)
    assert info.status == "failed" and len(parker.tokens["a"]) == 1
    (item,) = await client.items("p")
    assert item.last_error == "timed out waiting after 0.1 s"
    await client.close()


async def test_a_heartbeat_moves_the_deadline(db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker(timeout=1.0, on_timeout="fail")
    await client.create_partition("p", [NewItem("a", b"1")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _all_waiting(client), message="parked")
        before = (await client.items("p"))[0].retry_at
        deadline = await store.wait_heartbeat(parker.token("a"), 600)
        assert before is not None and deadline > before
        with pytest.raises(CompletionRefusedError):
            await store.wait_heartbeat(parker.token("a"), 0)
        await asyncio.sleep(0)  # the old deadline passes below, with the wait still on
        await wait_until(lambda: _past(store, before), message="the old deadline passed")
        assert await _statuses(client, "p") == {"a": "waiting"}
        await store.wait_complete(parker.token("a"), Result(done=True))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    await client.close()


async def _past(store, moment) -> bool:
    return await store.now() > moment


async def test_a_completion_after_a_cancel_is_refused(db_url, table_prefix,
                                                      make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _all_waiting(client), message="parked")
        token = parker.token("a")
        done, _ = await asyncio.gather(
            _outcome(store.wait_complete(token, Result(done=True))), client.cancel("p"))
        info = await client.partition("p")
        assert info.status == "cancelled"
        with pytest.raises(AlreadyCompletedError):
            await store.wait_complete(token, Result(done=True))
        items = await client.items("p")
        # Either the completion won (the item is complete) or the cancel did (the wait
        # ended: the item is available again, its token refused), never both.
        assert (done is True) == (items[0].status == "complete"), (done, items[0])
    await client.close()


async def test_each_wait_an_item_replaces_is_over_for_good(db_url, table_prefix,
                                                            make_store) -> None:
    """A park writes the wait in the item's row alone; each later wait of the item (a
    call again after a retry, or a completion that waits again) keeps the key it
    replaces, so every earlier token, and an operator's, is told its wait is over."""
    client = AsyncClient(db_url, table_prefix)
    parker = Parker()
    await client.create_partition("p", [NewItem("a", b"1")])
    store = make_store()
    async with running(Watcher(make_store(), parker, config())):
        await wait_until(lambda: _all_waiting(client), message="parked")
        assert await _wait_rows(store) == 0, "parking wrote its item's row only"
        operator = await store.wait_operator_token("p", "a")
        await store.wait_complete(parker.token("a"), RetryableError("again"))
        await wait_until(lambda: len(parker.tokens["a"]) == 2, message="called again")
        await wait_until(lambda: _all_waiting(client), message="parked again")
        again = await store.wait_complete(parker.token("a"), Result(wait=Wait(600)))
        assert again.completion_token is not None
        for used in (*parker.tokens["a"], operator):
            with pytest.raises(AlreadyCompletedError):
                await store.wait_complete(used, Result(done=True))
        await store.wait_complete(again.completion_token, Result(done=True))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    await client.close()


async def _wait_rows(store) -> int:  # type: ignore[no-untyped-def]
    w = store.tables.waits
    async with store.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(w))).scalar_one())


async def _outcome(call) -> bool:
    try:
        await call
    except AlreadyCompletedError:
        return False
    return True
