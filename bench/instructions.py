"""CPU instructions per item in library mode, counted by valgrind's callgrind.

Throughput moves with whatever else a shared machine is doing; an instruction
count does not (callgrind counts the same total for the same program and input,
however busy the other core is). The drain of :mod:`bench.instructions_worker`
(one watcher at its defaults, a no-op processor) runs twice under callgrind,
over the same ``partitions`` partitions holding ``instructions_items[0]`` and
then ``instructions_items[1]`` items, created beforehand by this process. Start-up
(imports, the store's first connection) and the partitions' own costs are the
same in both runs, so the difference divided by the difference in items is
what one item costs the engine: its read, call, result and write.

The count is of the processor's process only: on PostgreSQL and MariaDB that is
the engine and the driver; on SQLite the database engine runs inside it and is
counted too. Skipped, with the reason, where valgrind is not installed.
"""

from __future__ import annotations

import asyncio
import re
import shutil

from bench.common import (
    INSTRUMENTED_TIMEOUT,
    PYTHON,
    Outcome,
    Row,
    Settings,
    create_partitions,
    spread,
    statefeed_tables,
)
from bench.procs import REPO
from processor import AsyncClient

TITLE = "CPU instructions per item, library mode ({database}; valgrind --tool=callgrind)"
COLLECTED = re.compile(rb"Collected\s*:\s*([0-9]+)")


def valgrind_missing() -> str | None:
    """None when valgrind is on the PATH; otherwise why the scenario is skipped."""
    if shutil.which("valgrind") is None:
        return "valgrind not found (Debian: apt-get install valgrind)"
    return None


async def counted_drain(settings: Settings, items: int) -> int:
    """The instructions a drain of ``items`` items over the scenario's partitions costs
    the worker process, start-up included.

    Raises:
        RuntimeError: the worker failed, or callgrind printed no count.
    """
    partitions = settings.sizes.instructions_partitions
    async with statefeed_tables(settings.db_url, "instr") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            await create_partitions(client, spread(items, partitions))
        out = settings.work_dir / f"callgrind-{prefix}.out"
        process = await asyncio.create_subprocess_exec(
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            PYTHON, "-m", "bench.instructions_worker", "--db-url", settings.db_url,
            "--prefix", prefix, "--partitions", str(partitions),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=REPO)
        try:
            async with asyncio.timeout(max(settings.sizes.phase_timeout * 2,
                                           INSTRUMENTED_TIMEOUT)):
                output, _ = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        out.unlink(missing_ok=True)
    found = COLLECTED.search(output)
    if process.returncode != 0 or found is None:
        tail = output.decode(errors="replace")[-2000:]
        raise RuntimeError(f"the counted drain exited {process.returncode}:\n{tail}")
    return int(found.group(1))


async def run(settings: Settings) -> Outcome:
    """The instructions scenario (see the module docstring).

    Raises:
        RuntimeError: a counted drain failed.
        TimeoutError: a counted drain did not finish in time.
    """
    sizes = settings.sizes
    outcome = Outcome("instructions", TITLE.format(database=settings.database_title))
    missing = valgrind_missing()
    if missing is not None:
        outcome.status, outcome.reason = "skipped", missing
        outcome.rows.append(Row("instructions per item", "skipped", missing))
        return outcome
    fewer, more = sizes.instructions_items
    base = await counted_drain(settings, fewer)
    total = await counted_drain(settings, more)
    per_item = (total - base) / (more - fewer)
    outcome.rows += [
        Row("instructions per item", f"{per_item:,.0f}",
            f"({total:,} - {base:,}) / ({more:,} - {fewer:,}) items, "
            f"{sizes.instructions_partitions} partitions each"),
        Row("whole drain", f"{total / 1e9:,.2f} G instructions",
            f"{more:,} items, start-up (imports, first connection) included"),
    ]
    outcome.figures.update(
        partitions=sizes.instructions_partitions, items=[fewer, more],
        instructions=[base, total], instructions_per_item=round(per_item))
    return outcome
