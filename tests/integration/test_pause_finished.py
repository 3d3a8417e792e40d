"""Pausing a finished partition is refused, by the client and by the ingest API alike
(the CLI's answer is in tests/acceptance/test_cli_usage.py); on every database."""

from __future__ import annotations

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from watcher.errors import InvalidInputError
from watcher.store.db.urls import parse_database_url


async def test_a_finished_partition_cannot_be_paused(db_url: str, table_prefix: str) -> None:
    async with AsyncClient(db_url, table_prefix) as client:
        await client.create_partition("done", [NewItem("a", b"1")])
        assert await client.cancel("done")
        with pytest.raises(InvalidInputError, match=r"'done' is cancelled: .*nothing to pause"):
            await client.pause("done")
        assert (await client.partition("done")).paused_at is None
        # A running one still pauses; a paused one that then finished can be resumed.
        await client.create_partition("open", [NewItem("a", b"1")])
        assert await client.pause("open") is True
        assert await client.cancel("open")
        assert await client.resume("open") is True

        options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
        async with api_running(options) as url, httpx.AsyncClient(base_url=url) as http:
            answer = await http.post("/v1/partitions/done/pause")
            assert answer.status_code == 422, answer.text
            error = answer.json()["error"]
            assert error["code"] == "invalid_input" and "nothing to pause" in error["message"]
        assert (await client.partition("done")).paused_at is None
