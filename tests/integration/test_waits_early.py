"""A completion that arrives before the handler's parking answer is written, on every
live database: the token exists from the call, its wait only from the answer, so
``processor api`` looks the token up again for a moment and applies the completion
once the answer is written; a token still unknown after that answers 404 with
``Retry-After``, having written nothing."""

from __future__ import annotations

import asyncio
import time

import httpx

from processor import AsyncClient, NewItem
from processor.api.completions import NOT_YET_GRACE, RETRY_AFTER_SECONDS
from processor.api.server import ApiOptions, api_running
from tests.integration.test_waits import config
from tests.support.engine import running
from watcher import Result, Wait, Watcher, WorkItem
from watcher.store.db.urls import parse_database_url
from watcher.waits import new_completion_token


class EarlyCaller:
    """Gate 0 hands its token to an outside system that answers at once (before the
    handler's own answer, written 0.5 s later, parks the item)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.answers: list[httpx.Response] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def __call__(self, item: WorkItem) -> Result:
        if item.gate == 0:
            self.tasks.append(asyncio.create_task(self._complete(item.completion_token)))
            await asyncio.sleep(0.5)
            return Result(wait=Wait(600))
        return Result(done=True)

    async def _complete(self, token: str) -> None:
        self.answers.append(await self.http.post(f"/v1/completions/{token}",
                                                 json={"gate": 1}))


async def test_a_completion_before_the_parking_answer_waits_for_it(
        db_url, table_prefix, make_store) -> None:
    client = AsyncClient(db_url, table_prefix)
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    async with api_running(options) as api_url, \
            httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        caller = EarlyCaller(http)
        await client.create_partition("p", [NewItem("a", b"1")])
        async with running(Watcher(make_store(), caller, config())):
            info = await client.wait("p", timeout=30)
            await asyncio.gather(*caller.tasks)
        assert info.status == "complete"
        (answer,) = caller.answers
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "available" and answer.json()["gate"] == 1

        unknown = new_completion_token()
        began = time.monotonic()
        refused = await http.post(f"/v1/completions/{unknown}", json={"done": True})
        assert refused.status_code == 404
        assert time.monotonic() - began >= NOT_YET_GRACE * 0.9, "looked up again first"
        assert refused.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
        assert "nothing was written" in refused.json()["error"]["message"]
        malformed = await http.post("/v1/completions/not-a-token!", json={"done": True})
        assert malformed.status_code == 404 and "Retry-After" not in malformed.headers
    await client.close()
