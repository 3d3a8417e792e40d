"""The console names each partition's pipeline and version, on real databases over HTTP
in process: a column of the partitions list (and of the overview's open partitions),
``invoices@v2`` or the pipeline alone while no version is pinned, and a line of the
partition page."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from processor import AsyncClient, NewItem
from tests.integration.test_console import _web


@pytest.fixture
async def web(db_url: str, table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    async with _web(db_url, table_prefix, read_only=True) as opened:
        yield opened


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


def pipeline_cells(page: str) -> dict[str, str]:
    """Each listed partition's pipeline cell, by partition id."""
    rows = re.findall(r'<tr data-key="([^"]+)">\s*<td class="id">.*?</td>\s*'
                      r'<td class="id secondary pipeline">([^<]*)</td>', page, re.S)
    return {html.unescape(pid): html.unescape(cell) for pid, cell in rows}


def pipeline_line(page: str) -> str:
    """The partition page's pipeline line, as text."""
    found = re.search(r'<dd id="pipeline">(.*?)</dd>', page, re.S)
    assert found, "no pipeline line on the partition page"
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1)))


async def test_the_list_and_the_partition_page_show_the_pipeline_and_version(
        client: AsyncClient, web: httpx.AsyncClient) -> None:
    await client.create_partition("inv", [NewItem("a", b"{}")], pipeline="invoices",
                                  pipeline_version="v2")
    await client.create_partition("res", [NewItem("a", b"{}")], pipeline="resumes")
    await client.create_partition("plain", [NewItem("a", b"{}")])
    expected = {"inv": "invoices@v2", "res": "resumes", "plain": "default"}
    listed = await web.get("/partitions")
    assert listed.status_code == 200
    assert '<th class="secondary">pipeline</th>' in listed.text
    assert pipeline_cells(listed.text) == expected
    live = await web.get("/live/partitions")  # what the page refreshes itself with
    assert pipeline_cells(live.text) == expected
    overview = await web.get("/")  # its newest open partitions
    assert pipeline_cells(overview.text) == expected
    assert pipeline_line((await web.get("/partition?id=inv")).text) == "invoices version v2"
    assert pipeline_line((await web.get("/partition?id=res")).text) == (
        "resumes (version not pinned yet)")
    moved = await client.move_pipeline_version("inv", "v3")
    assert (moved.before, moved.after) == ("v2", "v3")
    assert pipeline_cells((await web.get("/partitions")).text)["inv"] == "invoices@v3"
    assert pipeline_line((await web.get("/partition?id=inv")).text) == "invoices version v3"
