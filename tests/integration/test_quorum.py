"""Quorums in library mode, on every live database: a gate passes on the first k of its
items, the others settled as ``skipped`` in the transaction that completed the k-th."""

from __future__ import annotations

import asyncio
import json

import pytest

from processor import AsyncClient, NewItem
from tests.support.engine import running, wait_until
from watcher import Result, Wait, Watcher, WatcherConfig, WorkItem
from watcher.errors import AlreadyCompletedError, InvalidInputError
from watcher.protocol import NonRetryableError, ReduceCall, ReduceResult

FAST = {"poll_interval": 0.05, "lease_duration": 3.0, "retry_backoff": 0.05,
        "retry_backoff_max": 0.2}


def config(**overrides: object) -> WatcherConfig:
    return WatcherConfig(**{"owner_id": "w1", **FAST, **overrides})  # type: ignore[arg-type]


async def _statuses(client: AsyncClient, partition_id: str = "p") -> dict[str, str]:
    return {item.id: item.status for item in await client.items(partition_id)}


class Providers:
    """Three providers asked at gate 0: ``fast`` answers at once, ``slow`` only when
    released, ``callback`` parks for a completion. Gate 1 (the pick) is done at once."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], int] = {}
        self.release = asyncio.Event()
        self.tokens: dict[str, str] = {}

    async def __call__(self, item: WorkItem) -> Result:
        key = (item.id, item.gate)
        self.calls[key] = self.calls.get(key, 0) + 1
        if item.gate == 1:
            return Result(done=True)
        if item.id == "slow":
            await self.release.wait()
            return Result(gate=1, data=b'"late"')
        if item.id == "callback":
            self.tokens[item.id] = item.completion_token
            return Result(wait=Wait(600))
        return Result(gate=1, data=b'"first"')


async def test_the_first_answer_of_three_passes_the_gate_and_late_ones_are_discarded(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    providers = Providers()
    await client.create_partition(
        "p", [NewItem("fast", b"1"), NewItem("slow", b"2"), NewItem("callback", b"3")],
        quorum={0: 1})
    async with running(Watcher(make_store(), providers, config(concurrency=8))):
        await wait_until(lambda: ("slow", 0) in providers.calls, message="slow called")
        await wait_until(lambda: _skipped(client, {"slow", "callback"}),
                         message="the slow and parked providers skipped")
        providers.release.set()  # the slow provider answers after the gate was decided
        info = await client.wait("p", timeout=30)
    assert info.status == "complete"
    assert info.counts == {"complete": 1, "skipped": 2}
    items = {item.id: item for item in await client.items("p")}
    assert items["slow"].data == b"2", "the late answer is discarded"
    assert items["slow"].gate == 0 and items["callback"].gate == 0
    assert providers.calls == {("fast", 0): 1, ("slow", 0): 1, ("callback", 0): 1,
                               ("fast", 1): 1}, "nothing skipped is called again"
    with pytest.raises(AlreadyCompletedError):
        await make_store().wait_complete(providers.tokens["callback"], Result(done=True))
    await client.close()


async def _skipped(client: AsyncClient, ids: set[str]) -> bool:
    statuses = await _statuses(client)
    return all(statuses.get(item_id) == "skipped" for item_id in ids)


class Reviewers:
    """Every review parks at gate 0 for a completion; gate 1 is done at once."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}

    async def __call__(self, item: WorkItem) -> Result:
        if item.gate == 0:
            self.tokens[item.id] = item.completion_token
            return Result(wait=Wait(600))
        return Result(done=True)


async def test_two_of_three_reviewers_pass_the_gate_and_the_third_is_skipped_at_once(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    reviewers = Reviewers()
    await client.create_partition("p", [NewItem(name, b"{}") for name in ("ann", "bo", "cy")],
                                  quorum={0: 2})
    store = make_store()
    async with running(Watcher(make_store(), reviewers, config())):
        await wait_until(lambda: _all(client, "waiting"), message="three reviews parked")
        await store.wait_complete(reviewers.tokens["ann"], Result(gate=1))
        assert (await _statuses(client))["cy"] == "waiting", "one approval is not enough"
        await store.wait_complete(reviewers.tokens["bo"], Result(gate=1))
        # Skipped in the transaction of the second approval, before any processor acts.
        assert (await _statuses(client))["cy"] == "skipped"
        with pytest.raises(AlreadyCompletedError):
            await store.wait_complete(reviewers.tokens["cy"], Result(gate=1))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 2, "skipped": 1}
    await client.close()


async def test_items_created_at_a_later_gate_do_not_count_toward_an_earlier_quorum(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    reviewers = Reviewers()
    # "report" starts at gate 1: it is no reviewer, and has passed no review.
    await client.create_partition(
        "p", [*(NewItem(name, b"{}") for name in ("ann", "bo", "cy")),
              NewItem("report", b"{}", gate=1)], quorum={0: 2})
    store = make_store()
    async with running(Watcher(make_store(), reviewers, config())):
        await wait_until(lambda: _statuses_are(client, dict.fromkeys(("ann", "bo", "cy"),
                                                                      "waiting")),
                         message="three reviews parked")
        await store.wait_complete(reviewers.tokens["ann"], Result(gate=1))
        statuses = await _statuses(client)
        assert statuses["bo"] == statuses["cy"] == "waiting", "one approval is not two"
        await store.wait_complete(reviewers.tokens["bo"], Result(gate=1))
        assert (await _statuses(client))["cy"] == "skipped"
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 3, "skipped": 1}
    await client.close()


async def _all(client: AsyncClient, status: str) -> bool:
    statuses = await _statuses(client)
    return len(statuses) == 3 and set(statuses.values()) == {status}


class Rejecting(Reviewers):
    """``ann`` and ``bo`` reject (for good) at once; ``cy`` parks."""

    async def __call__(self, item: WorkItem) -> Result:
        if item.gate == 0 and item.id in ("ann", "bo"):
            raise NonRetryableError("rejected")
        return await super().__call__(item)


async def test_an_unreachable_quorum_fails_the_partition_without_waiting(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem(name, b"{}") for name in ("ann", "bo", "cy")],
                                  quorum={0: 2})
    async with running(Watcher(make_store(), Rejecting(), config())):
        info = await client.wait("p", timeout=30)
    assert info.status == "failed", "two rejections of three: two approvals cannot come"
    assert (await _statuses(client))["cy"] == "waiting"
    await client.close()


async def test_an_unreachable_quorum_goes_on_under_the_continue_policy(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    rejecting = Rejecting()
    await client.create_partition("p", [NewItem(name, b"{}") for name in ("ann", "bo", "cy")],
                                  quorum={0: 2}, on_item_failure="continue")
    store = make_store()
    async with running(Watcher(make_store(), rejecting, config())):
        await wait_until(lambda: "cy" in rejecting.tokens, message="cy called")
        # Its parking answer written: a completion before it would find no wait yet.
        await wait_until(lambda: _statuses_are(client, {"cy": "waiting"}),
                         message="cy parked")
        assert (await client.partition("p")).status == "available"  # the gate waits for cy
        await store.wait_complete(rejecting.tokens["cy"], Result(gate=1))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 1, "failed": 2}
    await client.close()


@pytest.mark.parametrize("quorum", [
    {0: 0}, {0: -1}, {0: True}, {0: 1.5}, {-1: 1}, {"x": 1}, {0: "2"}, [1, 2], "0=1",
    {0: 1, "0": 2}])
async def test_a_bad_quorum_is_refused_and_writes_nothing(db_url, table_prefix,
                                                         quorum) -> None:
    client = AsyncClient(db_url, table_prefix)
    with pytest.raises(InvalidInputError, match="quorum"):
        await client.create_partition("p", [NewItem("a", b"1")], quorum=quorum)
    assert await client.partitions() == []
    await client.close()


async def test_the_api_and_its_ndjson_form_take_a_quorum(db_url, table_prefix) -> None:
    from tests.integration.test_api import error_of, lines, serving

    client = AsyncClient(db_url, table_prefix)
    async with serving(db_url, table_prefix) as api:
        made = await api.put("/v1/partitions/j", json={"items": [{"id": "a", "data": 1}],
                                                       "quorum": {"0": 1, "2": 3}})
        assert made.status_code == 201, made.text
        assert made.json()["quorum"] == {"0": 1, "2": 3}
        streamed = await api.put("/v1/partitions/n?quorum=1=2", content=lines(
            {"id": "b", "data": 2}), headers={"content-type": "application/x-ndjson"})
        assert streamed.status_code == 201, streamed.text
        assert streamed.json()["quorum"] == {"1": 2}
        listed = await api.get("/v1/partitions/j/items?status=skipped")
        assert listed.status_code == 200, "skipped is an item status the API filters on"
        for body in ({"quorum": {"0": 0}}, {"quorum": {"x": 1}}, {"quorum": [1]},
                     {"quorum": {"0": "1"}}):
            refused = await api.put("/v1/partitions/bad", json=body)
            assert refused.status_code in (400, 422), refused.text
            assert error_of(refused)["field"] == "quorum", refused.text
        for query in ("quorum=1", "quorum=1=2,1=3", "quorum=a=1"):
            refused = await api.put(f"/v1/partitions/bad?{query}", content=lines(
                {"id": "b", "data": 2}), headers={"content-type": "application/x-ndjson"})
            assert refused.status_code == 400 and error_of(refused)["field"] == "quorum"
        assert (await api.get("/v1/partitions/bad")).status_code == 404
    store_rows = {info.id for info in await client.partitions()}
    assert store_rows == {"j", "n"}
    await client.close()


class FirstThenPark:
    """Gate 0: ``a`` is done at once, ``b`` parks; gate 1 parks, so the partition stays
    open."""

    async def __call__(self, item: WorkItem) -> Result:
        if item.gate == 0 and item.id == "a":
            return Result(done=True)
        return Result(wait=Wait(600))


async def test_item_retention_sheds_skipped_items_with_the_complete_ones(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    await client.create_partition("p", [NewItem("a", b"1"), NewItem("b", b"2"),
                                        NewItem("c", b"3", gate=1)], quorum={0: 1})
    store = make_store()
    async with running(Watcher(make_store(), FirstThenPark(), config())):
        await wait_until(lambda: _is(client, {"a": "complete", "b": "skipped",
                                              "c": "waiting"}),
                         message="a complete, b skipped, c parked at gate 1")
        await asyncio.sleep(0.01)  # older than the retention's 1 ms
        removed, _ = await store.items_purge_finished("p", older_than=0.001, batch=10)
    assert removed == 2
    assert await _statuses(client) == {"c": "waiting"}
    await client.close()


async def _statuses_are(client: AsyncClient, wanted: dict[str, str]) -> bool:
    """Whether the items named in ``wanted`` have those statuses (the others any)."""
    statuses = await _statuses(client)
    return all(statuses.get(item) == status for item, status in wanted.items())


async def _is(client: AsyncClient, wanted: dict[str, str]) -> bool:
    return await _statuses(client) == wanted


class LateProviders:
    """Gate 0: ``slow1`` and ``slow2`` answer only when released, ``callback`` parks for
    a completion; gate 1 is done at once."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], int] = {}
        self.release = asyncio.Event()
        self.token = ""

    async def __call__(self, item: WorkItem) -> Result:
        key = (item.id, item.gate)
        self.calls[key] = self.calls.get(key, 0) + 1
        if item.gate == 1:
            return Result(done=True)
        if item.id == "callback":
            self.token = item.completion_token
            return Result(wait=Wait(600))
        await self.release.wait()
        return Result(gate=1, data=b'"late"')


async def test_late_answers_to_skipped_items_are_fenced_off_quietly(
        db_url, table_prefix, make_store, caplog) -> None:
    client = AsyncClient(db_url, table_prefix)
    providers = LateProviders()
    await client.create_partition(
        "p", [NewItem("slow1", b"1"), NewItem("slow2", b"2"), NewItem("callback", b"3")],
        quorum={0: 1})
    store = make_store()
    # A long poll interval: the processor does not look at the quorum (and give the
    # calls up) before the two answers arrive, so they reach the writer.
    slow_looks = config(concurrency=8, poll_interval=10.0, lease_duration=60.0)
    with caplog.at_level("DEBUG"):
        async with running(Watcher(make_store(), providers, slow_looks)):
            await wait_until(lambda: _in_flight_and_parked(client, providers),
                             message="two calls in flight, one parked")
            # The completion is the first of three: it skips the two calls in flight.
            await store.wait_complete(providers.token, Result(gate=1))
            providers.release.set()  # both answer after the gate was decided
            assert await _skipped(client, {"slow1", "slow2"})
            info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 1, "skipped": 2}
    for item in await client.items("p", status="skipped"):
        assert item.gate == 0 and item.data in (b"1", b"2"), "the late answers are dropped"
    assert providers.calls == {("slow1", 0): 1, ("slow2", 0): 1, ("callback", 0): 1,
                               ("callback", 1): 1}, "nothing skipped is called again"
    messages = [record.getMessage() for record in caplog.records]
    loud = [record.getMessage() for record in caplog.records
            if record.levelname in ("WARNING", "ERROR") and "slow" in record.getMessage()]
    assert loud == [], "a fenced late answer is no failure"
    fenced = {name for name in ("slow1", "slow2")
              if any("action=stale_result" in line and f"item={name}" in line
                     for line in messages)}
    assert fenced == {"slow1", "slow2"}, "the writer's version guard dropped both answers"
    await client.close()


async def test_a_completion_that_meets_the_quorum_gives_up_the_calls_in_flight(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    providers = LateProviders()  # never released: the slow calls would hang for good
    await client.create_partition(
        "p", [NewItem("slow1", b"1"), NewItem("slow2", b"2"), NewItem("callback", b"3")],
        quorum={0: 1})
    async with running(Watcher(make_store(), providers, config(concurrency=8))):
        await wait_until(lambda: _in_flight_and_parked(client, providers),
                         message="two calls in flight, one parked")
        await make_store().wait_complete(providers.token, Result(gate=1))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 1, "skipped": 2}
    assert providers.calls == {("slow1", 0): 1, ("slow2", 0): 1, ("callback", 0): 1,
                               ("callback", 1): 1}
    await client.close()


async def _in_flight_and_parked(client: AsyncClient, providers: LateProviders) -> bool:
    return len(providers.calls) == 3 and (await _statuses(client))["callback"] == "waiting"


async def test_two_completions_racing_to_be_the_kth_skip_the_rest_once(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    reviewers = Reviewers()
    names = ("ann", "bo", "cy", "di")
    await client.create_partition("p", [NewItem(name, b"{}") for name in names],
                                  quorum={0: 2})
    first, second = make_store(), make_store()
    async with running(Watcher(make_store(), reviewers, config())):
        await wait_until(lambda: _parked(client, names), message="four reviews parked")
        parked = {item.id: item.version for item in await client.items("p")}
        await asyncio.gather(first.wait_complete(reviewers.tokens["ann"], Result(gate=1)),
                             second.wait_complete(reviewers.tokens["bo"], Result(gate=1)))
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 2, "skipped": 2}
    items = {item.id: item for item in await client.items("p", status="skipped")}
    assert set(items) == {"cy", "di"}
    assert all(items[name].version == parked[name] + 1 for name in items), "skipped once"
    for name in ("cy", "di"):
        with pytest.raises(AlreadyCompletedError):
            await first.wait_complete(reviewers.tokens[name], Result(gate=1))
    await client.close()


async def _parked(client: AsyncClient, names: tuple[str, ...]) -> bool:
    statuses = await _statuses(client)
    return set(statuses) == set(names) and set(statuses.values()) == {"waiting"}


class ReduceAfterQuorum:
    """Gate 0: ``a`` and ``b`` answer at once (to gate 1), ``c`` and ``d`` park; gate 1 is
    a reduce gate that records the items it is given."""

    def __init__(self) -> None:
        self.reduced: list[str] = []

    async def __call__(self, item: WorkItem) -> Result:
        if item.id in ("a", "b"):
            return Result(gate=1, data=item.data)
        return Result(wait=Wait(600))

    async def reduce(self, call: ReduceCall) -> ReduceResult:
        self.reduced += [item.id for item in call.items]
        return ReduceResult(default=Result(done=True),
                            result=json.dumps(sorted(self.reduced)).encode())


async def test_a_reduce_gate_after_a_quorum_gate_sees_only_the_items_that_passed(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    handler = ReduceAfterQuorum()
    await client.create_partition("p", [NewItem(name, b"1") for name in "abcd"],
                                  reduce_gates=[1], quorum={0: 2})
    watcher = Watcher(make_store(), handler, config(), reduce=handler.reduce)
    async with running(watcher):
        info = await client.wait("p", timeout=30)
    assert info.status == "complete" and info.counts == {"complete": 2, "skipped": 2}
    assert sorted(handler.reduced) == ["a", "b"], "skipped items are not reduced"
    assert info.result_json() == ["a", "b"]
    assert {item.id for item in await client.items("p", status="skipped")} == {"c", "d"}
    await client.close()
