"""The first k of N is exact when answers and completions race, on every live database:
a per-item or batch handler whose answers arrive together, and 20 completions by token
through ``processor api`` at once, each let exactly k items of the gate pass. An
unreachable quorum fails its partition even when every item completed, and the token of
an item skipped while its call was in flight answers as every settled item's does."""

from __future__ import annotations

import asyncio

import pytest

from processor import AsyncClient, NewItem
from tests.integration.test_api import serving
from tests.integration.test_quorum import Reviewers
from tests.support.engine import running, wait_until
from watcher import Result, Watcher, WatcherConfig, WorkItem
from watcher.errors import AlreadyCompletedError
from watcher.records import GateSummary, ItemWrite
from watcher.waits import WaitWrite, new_completion_token, token_hash

FAST = {"poll_interval": 0.05, "lease_duration": 5.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


def config(**overrides: object) -> WatcherConfig:
    return WatcherConfig(**{"owner_id": "w1", **FAST, **overrides})  # type: ignore[arg-type]


class Together:
    """Gate 0: every call waits until ``n`` calls are in, then all answer ``{"gate": 1}``
    at the same moment (so their writes meet in one batch, or in racing batches).
    Gate 1 is done at once. With ``batch``, it serves the batch protocol too."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.arrived = 0
        self.all_in = asyncio.Event()
        self.gate1: list[str] = []

    async def _gate0(self, count: int) -> None:
        self.arrived += count
        if self.arrived >= self.n:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 60)

    async def process(self, item: WorkItem) -> Result:
        if item.gate == 1:
            self.gate1.append(item.id)
            return Result(done=True)
        await self._gate0(1)
        return Result(gate=1)


class TogetherInBatches(Together):
    async def process_batch(self, items: list[WorkItem]) -> list[Result]:
        at_zero = [item for item in items if item.gate == 0]
        if at_zero:
            await self._gate0(len(at_zero))
        results = []
        for item in items:
            if item.gate == 1:
                self.gate1.append(item.id)
                results.append(Result(done=True))
            else:
                results.append(Result(gate=1))
        return results


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("protocol", [Together, TogetherInBatches])
async def test_answers_arriving_together_let_exactly_k_items_pass(
        db_url, table_prefix, make_store, k: int, protocol: type[Together]) -> None:
    client = AsyncClient(db_url, table_prefix)
    n = 8
    handler = protocol(n)
    await client.create_partition("p", [NewItem(f"i{j}", b"{}") for j in range(n)],
                                  quorum={0: k})
    watcher = Watcher(make_store(), handler, config(concurrency=n, result_batch=n))
    async with running(watcher):
        info = await client.wait("p", timeout=60)
    assert info.status == "complete"
    assert info.counts == {"complete": k, "skipped": n - k}, info.counts
    assert len(handler.gate1) == k, "only the items that passed are called at gate 1"
    await client.close()


async def test_twenty_completions_racing_through_the_api_let_exactly_k_pass(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    n, k = 20, 3
    names = [f"r{j:02d}" for j in range(n)]
    parking = Reviewers()  # every item parks at gate 0; gate 1 is done
    await client.create_partition("p", [NewItem(name, b"{}") for name in names],
                                  quorum={0: k})
    async with running(Watcher(make_store(), parking, config(concurrency=n))):
        await wait_until(lambda: _all_waiting(client, names), timeout=60,
                         message="twenty items parked")
        async with serving(db_url, table_prefix) as http:
            answers = await asyncio.gather(*(
                http.post(f"/v1/completions/{parking.tokens[name]}", json={"gate": 1})
                for name in names))
            codes = sorted(answer.status_code for answer in answers)
            assert codes == [200] * k + [409] * (n - k), [a.text for a in answers
                                                          if a.status_code not in (200, 409)]
            assert {answer.json()["error"]["code"] for answer in answers
                    if answer.status_code == 409} == {"already_completed"}
        info = await client.wait("p", timeout=60)
    assert info.status == "complete"
    assert info.counts == {"complete": k, "skipped": n - k}, info.counts
    await client.close()


async def _all_waiting(client: AsyncClient, names: list[str]) -> bool:
    statuses = {item.id: item.status for item in await client.items("p")}
    return set(statuses) == set(names) and set(statuses.values()) == {"waiting"}


class Done:
    async def __call__(self, item: WorkItem) -> Result:
        return Result(gate=1) if item.gate == 0 else Result(done=True)


async def test_a_quorum_larger_than_its_gate_fails_the_partition_even_when_all_complete(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem(name, b"{}") for name in ("a", "b", "c")],
                                  quorum={0: 5})
    async with running(Watcher(make_store(), Done(), config())):
        info = await client.wait("p", timeout=30)
    assert info.status == "failed", "3 items cannot make a quorum of 5"
    assert info.last_error is not None and "quorum" in info.last_error, info.last_error
    assert "5" in info.last_error and "3" in info.last_error, info.last_error
    await client.close()


class SlowParker:
    """Gate 0: ``fast`` answers at once; ``slow`` reads its token (as a handler that
    hands it to an outside system does), then never answers: its call is in flight
    when the quorum of one passes, and is given up."""

    def __init__(self) -> None:
        self.token: str | None = None

    async def __call__(self, item: WorkItem) -> Result:
        if item.gate == 1:
            return Result(done=True)
        if item.id == "fast":
            await wait_until(lambda: self.token is not None, message="slow called")
            return Result(gate=1)
        self.token = item.completion_token
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_the_token_of_an_item_skipped_in_flight_is_already_completed(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    handler = SlowParker()
    await client.create_partition("p", [NewItem("fast", b"1"), NewItem("slow", b"2")],
                                  quorum={0: 1})
    async with running(Watcher(make_store(), handler, config())):
        info = await client.wait("p", timeout=30)
    assert info.counts == {"complete": 1, "skipped": 1}
    assert handler.token is not None
    async with serving(db_url, table_prefix) as http:
        answer = await http.post(f"/v1/completions/{handler.token}", json={"gate": 1})
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "already_completed"
    assert "skipped" in answer.json()["error"]["message"]
    await client.close()


async def test_a_parking_answer_fenced_off_leaves_its_token_already_completed(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2")],
                                  quorum={0: 1})
    store = make_store()
    item = {i.id: i for i in await client.items("p")}["b"]
    stale = item.version
    await client.cancel("p")
    token = new_completion_token()
    park = ItemWrite("p", "b", stale, "waiting", None, 1, retry_delay=600.0,
                     wait=WaitWrite(token_hash(token), 600.0))
    assert await store.items_apply([park], "w1") == [False], "a cancelled partition's item"
    with pytest.raises(AlreadyCompletedError):
        await store.wait_complete(token, Result(gate=1))
    assert await store.items_apply([park], "w1") == [False], "fenced twice: kept once"
    await client.close()


LEASE = 1.0


async def test_a_completion_that_meets_the_quorum_while_the_gate_is_summed_up_moves_it_on(
        db_url, table_prefix, make_store) -> None:
    # Proof seed 2132201203 (SQLite): the supervisor read its gate's summary (every item
    # waiting, none past the gate), the completions that met the quorum moved three
    # items to gate 1, then its quorum count passed the gate and the stale summary
    # closed the partition complete at gate 0, those three left available at gate 1.
    client = AsyncClient(db_url, table_prefix)
    parking = Reviewers()  # every item parks at gate 0; gate 1 is done
    names = ["a", "b", "c"]
    await client.create_partition("p", [NewItem(name, b"{}") for name in names],
                                  quorum={0: 1})
    store = make_store()
    summary_read = store.gate_summary
    completed: list[str] = []

    async def completion_after_the_read(partition_id: str, gate: int) -> GateSummary:
        summary = await summary_read(partition_id, gate)
        if not completed and summary.waiting == len(names):
            completed.append("a")  # lands after the read, before the quorum's count
            await client.complete(parking.tokens["a"], done=False, gate=1, data=b"{}")
            # A renewal in between takes the version the completion moved on as the
            # lease's: the guard of the move that follows no longer fences it off.
            await asyncio.sleep(LEASE)
        return summary

    store.gate_summary = completion_after_the_read  # type: ignore[method-assign]
    async with running(Watcher(store, parking, config(concurrency=3, lease_duration=LEASE))):
        info = await client.wait("p", timeout=30)
    assert completed == ["a"], "the completion was made while the gate was summed up"
    items = {item.id: (item.status, item.gate) for item in await client.items("p")}
    assert items == {"a": ("complete", 1), "b": ("skipped", 0), "c": ("skipped", 0)}, items
    assert (info.status, info.gate) == ("complete", 1)
    await client.close()
