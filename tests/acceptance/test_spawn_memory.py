"""The paging example (examples/paging_producer.py), run as it stands: one producer
spawns its children a page per call, every child is written once with its parent, and
the processor's resident memory stays flat while they go in.

The default run spawns 20,000 children; ``STATEFEED_SOAK=1`` adds the 200,000 run.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from processor import AsyncClient

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "paging_producer.py"
# Growth allowed after the first report: a resource bound, generous for allocator noise.
MAX_GROWTH_MB = 40.0


async def spawn_in_pages(children: int, tmp_path: Path) -> None:
    database = tmp_path / "paging.db"
    script = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), str(children), str(database), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(script.communicate(), timeout=900)
    text = out.decode()
    assert script.returncode == 0, err.decode()[-3000:] + text[-2000:]
    assert f"done: {children} children complete" in text
    samples = [float(mb) for mb in re.findall(r"^rss\s+([\d.]+) MB", text, re.M)]
    assert len(samples) >= 2, text
    growth = max(samples) - samples[0]
    assert growth <= MAX_GROWTH_MB, f"resident memory grew {growth:.1f} MB: {samples}"

    async with AsyncClient(f"sqlite:///{database}") as client:
        info = await client.partition("folder")
        assert info.status == "complete" and info.spawned == children
        assert info.counts == {"complete": children + 1}
        parents: set[str | None] = set()
        count = 0
        async for item in client.iter_items("folder", with_data=False):
            if item.id != "listing":
                parents.add(item.parent)
                count += 1
        assert count == children and parents == {"listing"}


async def test_a_paging_producer_spawns_every_child_once_in_flat_memory(tmp_path) -> None:
    await spawn_in_pages(20_000, tmp_path)


@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("STATEFEED_SOAK"),
                    reason="soak test: set STATEFEED_SOAK=1 to run it")
async def test_two_hundred_thousand_children_in_flat_memory(tmp_path) -> None:
    await spawn_in_pages(200_000, tmp_path)
