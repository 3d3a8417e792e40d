"""HTTP modes: ``processor run`` against bare HTTP clients, at the same concurrency, on one handler.

The handler (:mod:`bench.handler_app`) runs in its own uvicorn process and
times every caller the same way: from the first request's arrival to the last
answer, on the machine-wide monotonic clock. So the figure is the rate the
handler was fed, whoever fed it.

- Per item: ``processor run --concurrency C`` drains N items (one request
  each, inserted before it starts); a bare ``httpx.AsyncClient`` and a bare
  ``aiohttp`` session post the same N payloads, with the same headers, over C
  connections. Ratio: processor / bare aiohttp.
- Batch: ``processor run --handler-batch-size B`` (if this build has the flag)
  drains N items through ``/batch``; ratio: batch / the best bare per-item client.

For the processor, "all written" adds the time until every partition closed
(its last results written), read from the database every 20 ms.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import func, select

from bench.common import (
    Outcome,
    Row,
    Settings,
    best_round,
    cpu_seconds,
    create_partitions,
    rate_text,
    ratio,
    ratio_goal,
    settle_heap,
    spread,
    statefeed_tables,
    wait_for,
)
from bench.procs import Handler, Processes, processor_help
from processor import AsyncClient

TITLE_ITEM = "HTTP per-item mode: processor run vs bare HTTP clients, same concurrency"
TITLE_BATCH = "HTTP batch mode: processor run --handler-batch-size vs bare per-item clients"
PAYLOAD = b'{"n":0}'
REQUEST_TIMEOUT = 30.0
WARMUP_REQUESTS = 200
POLL = "0.1"
BATCH_OPTION = "--handler-batch-size"
TRANSPORT_OPTION = "--http-transport"


@dataclass(frozen=True)
class Run:
    """One system's figures at the handler."""

    system: str
    items: int
    requests: int
    seconds: float  # first arrival to last answer, at the handler
    written_seconds: float | None = None  # first arrival until all results written
    caller_cpu: float | None = None  # CPU seconds the caller used meanwhile
    handler_cpu: float | None = None  # CPU seconds the handler used meanwhile
    rounds: tuple[float, ...] = ()  # items/s of every round, when run more than once

    @property
    def per_second(self) -> float:
        """Items answered per second."""
        return self.items / self.seconds

    def as_json(self) -> dict[str, Any]:
        """The run as a JSON object."""
        figures: dict[str, Any] = {
            "system": self.system, "items": self.items, "requests": self.requests,
            "seconds": round(self.seconds, 4), "items_per_s": round(self.per_second, 1),
            "rounds_items_per_s": list(self.rounds)}
        if self.written_seconds is not None:
            figures["all_written_seconds"] = round(self.written_seconds, 4)
            figures["items_per_s_until_written"] = round(self.items / self.written_seconds, 1)
        if self.caller_cpu is not None:
            figures["caller_cpu_us_per_item"] = round(self.caller_cpu / self.items * 1e6, 1)
        if self.handler_cpu is not None:
            figures["handler_cpu_us_per_item"] = round(self.handler_cpu / self.items * 1e6, 1)
        return figures

    def detail(self) -> str:
        """The line under the figure in the table."""
        text = f"{self.items:,} items, {self.requests:,} requests in {self.seconds:.2f} s"
        if self.written_seconds is not None:
            text += f"; all written after {self.written_seconds:.2f} s"
        if self.caller_cpu is not None and self.handler_cpu is not None:
            text += (f"; CPU per item: caller {self.caller_cpu / self.items * 1e6:,.0f} us, "
                     f"handler {self.handler_cpu / self.items * 1e6:,.0f} us")
        return text


# --------------------------------------------------------------------------- bare clients


def _headers(number: int) -> dict[str, str]:
    """The headers the processor sends with an item (same names, same sizes)."""
    return {"Content-Type": "application/octet-stream", "X-Partition-Id": "p00000",
            "X-Item-Id": f"i{number:06d}", "X-Gate": "0", "X-Attempt": "1",
            "Idempotency-Key": f"{number:032x}", "User-Agent": "statefeed-bench"}


async def _lanes(count: int, concurrency: int, post: Callable[[int], Awaitable[None]]) -> None:
    """Run ``post(n)`` for n in range(count), ``concurrency`` at a time (shared budget)."""
    budget = iter(range(count))

    async def lane() -> None:
        for number in budget:
            await post(number)

    await asyncio.gather(*(lane() for _ in range(min(concurrency, count))))


async def bare_httpx(url: str, count: int, concurrency: int) -> None:
    """POST ``count`` payloads with one pooled ``httpx.AsyncClient``.

    Raises:
        RuntimeError: an answer was not 200.
    """
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT) as http:
        async def post(number: int) -> None:
            response = await http.post(url, content=PAYLOAD, headers=_headers(number))
            if response.status_code != 200:
                raise RuntimeError(f"bare httpx: HTTP {response.status_code}")
            json.loads(response.content)

        await _lanes(count, concurrency, post)


async def bare_aiohttp(url: str, count: int, concurrency: int) -> None:
    """POST ``count`` payloads with one ``aiohttp.ClientSession`` of ``concurrency`` connections.

    Raises:
        RuntimeError: an answer was not 200.
    """
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def post(number: int) -> None:
            async with session.post(url, data=PAYLOAD, headers=_headers(number)) as response:
                body = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"bare aiohttp: HTTP {response.status}")
                json.loads(body)

        await _lanes(count, concurrency, post)


async def measure_bare(handler: Handler, system: str, client: Any, count: int,
                       concurrency: int, timeout: float) -> Run:  # noqa: ASYNC109
    """Reset the handler, run a bare client, read the handler's figures."""
    await handler.reset()
    settle_heap()
    handler_cpu, own_cpu = handler.cpu_seconds(), cpu_seconds()
    async with asyncio.timeout(timeout):
        await client(f"{handler.url}/", count, concurrency)
    own_cpu, handler_cpu = cpu_seconds() - own_cpu, handler.cpu_seconds() - handler_cpu
    stats = await handler.stats()
    return Run(system, stats["items"], stats["requests"], stats["last"] - stats["first"],
               caller_cpu=own_cpu, handler_cpu=handler_cpu)


# --------------------------------------------------------------------------- processor


async def _open_partitions(client: AsyncClient) -> int:
    partitions = client.store.tables.partitions
    async with client.store.engine.connect() as conn:
        return (await conn.execute(select(func.count()).where(
            partitions.c.status == "available"))).scalar_one()


async def measure_processor(settings: Settings, procs: Processes, handler: Handler, *,
                            system: str, items: int, args: tuple[str, ...],
                            routed: bool = False,
                            pipeline: Callable[[int], str] | None = None) -> Run:
    """Insert ``items`` over the configured partitions (partition k in ``pipeline(k)``,
    ``default`` without it), run ``processor run`` until they are all complete, and read
    the handler's figures. ``routed``: ``args`` name the handlers (``--routes``) in
    place of ``--handler-url``.

    Raises:
        TimeoutError: not done within the phase timeout.
        RuntimeError: the processor exited early, or items were retried or failed.
    """
    sizes = settings.sizes
    async with statefeed_tables(settings.db_url, "http") as prefix:
        async with AsyncClient(settings.db_url, prefix) as client:
            await create_partitions(client, spread(items, sizes.partitions), data=PAYLOAD,
                                    pipeline=pipeline)
            await handler.reset()
            name = re.sub(r"[^a-z0-9]+", "-", system.lower()).strip("-")
            child = await procs.processor(name,
                                          handler_url=None if routed else f"{handler.url}/",
                                          db_url=settings.db_url, prefix=prefix,
                                          args=("--poll-interval", POLL, *args))
            # CPU of both processes, sampled as the run goes: the processor's start-up
            # (imports, connecting) ends before the handler's first request, so the
            # sample just before that request is the baseline.
            samples: list[tuple[float, float, float]] = []
            pid = child.process.pid
            try:
                async def finished() -> bool:
                    if not child.running:
                        raise RuntimeError(f"{system} exited ({child.process.returncode}):\n"
                                           f"{child.log()[-2000:]}")
                    samples.append((time.monotonic(), cpu_seconds(pid), handler.cpu_seconds()))
                    return await _open_partitions(client) == 0

                await wait_for(finished, timeout=sizes.phase_timeout, interval=0.02,
                               what=f"{system} to complete {items} items")
                done_at = time.monotonic()
                samples.append((done_at, cpu_seconds(pid), handler.cpu_seconds()))
            finally:
                await child.terminate()
            stats = await handler.stats()
            failed = [info.id for info in await client.partitions() if info.status != "complete"]
    if failed or stats["items"] != items:
        raise RuntimeError(f"{system}: handler answered {stats['items']} items for {items}; "
                           f"partitions not complete: {failed[:5]}")
    before = [sample for sample in samples if sample[0] <= stats["first"]] or samples[:1]
    _, processor_cpu, handler_cpu = before[-1]
    return Run(system, stats["items"], stats["requests"], stats["last"] - stats["first"],
               done_at - stats["first"], caller_cpu=samples[-1][1] - processor_cpu,
               handler_cpu=samples[-1][2] - handler_cpu)


def transports(help_text: str) -> tuple[str | None, list[str]]:
    """The default HTTP transport and the others, if ``processor run`` has the option."""
    if TRANSPORT_OPTION not in help_text:
        return None, []
    line = help_text[help_text.index(TRANSPORT_OPTION):]
    line = line[: line.find("\n  --", 1) if "\n  --" in line else len(line)]
    default = re.search(r"default:\s*([a-z0-9_-]+)", line)
    names = [name for name in ("aiohttp", "httpx") if name in line]
    chosen = default.group(1) if default else None
    return chosen, [name for name in names if name != chosen]


async def warm_up(handler: Handler) -> None:
    """A few requests so the handler's first measured request is not its very first."""
    async with asyncio.timeout(60):
        await bare_aiohttp(f"{handler.url}/", WARMUP_REQUESTS, 8)


# --------------------------------------------------------------------------- scenarios


async def best_of_interleaved(plan: list[tuple[str, Any, int]],
                              measure: Callable[[str, Any], Awaitable[Run]]) -> list[Run]:
    """Run each ``(system, how, rounds)`` of ``plan`` its number of rounds, the systems
    taking turns so that a slow moment hits them alike; the best run of each, in order."""
    runs: dict[str, list[Run]] = {system: [] for system, _, _ in plan}
    for round_number in range(max(rounds for _, _, rounds in plan)):
        for system, how, rounds in plan:
            if round_number < rounds:
                runs[system].append(await measure(system, how))
    return [best_round(system_runs) for system_runs in runs.values()]


async def bare_baselines(settings: Settings, handler: Handler) -> list[Run]:
    """Bare aiohttp and bare httpx at the configured concurrency, best of the rounds and
    of at least ``sizes.headline_rounds`` (measured once per benchmark run and reused).

    A run lasts a second or two, so one slow moment (PostgreSQL vacuuming after
    the previous scenario, three processes landing badly on two cores) can cut
    it by a third; the best of several shows what the machine allows. Both
    sides of a headline ratio get the same number of runs.
    """
    cached = settings.shared.get("bare_runs")
    if cached is not None:
        return cached
    sizes = settings.sizes
    # bare httpx takes about 20 s a run and is far from the headline: the rounds asked for.
    clients = [("bare aiohttp", bare_aiohttp, max(settings.rounds, sizes.headline_rounds)),
               ("bare httpx", bare_httpx, settings.rounds)]

    async def measure(system: str, client: Any) -> Run:
        return await measure_bare(handler, system, client, sizes.http_items,
                                  sizes.concurrency, sizes.phase_timeout)

    best = await best_of_interleaved(clients, measure)
    settings.shared["bare_runs"] = best
    return best


async def run_per_item(settings: Settings) -> Outcome:
    """The HTTP per-item scenario (see the module docstring)."""
    sizes = settings.sizes
    outcome = Outcome("http", TITLE_ITEM)
    default_transport, other_transports = transports(await processor_help())
    concurrency = ("--concurrency", str(sizes.concurrency))
    # The other transport takes about 20 s a run and is far from the headline.
    systems = [(f"processor run ({default_transport} transport, default)"
                if default_transport else "processor run", concurrency,
                max(settings.rounds, sizes.headline_rounds))]
    systems += [(f"processor run ({transport} transport)",
                 (*concurrency, TRANSPORT_OPTION, transport), settings.rounds)
                for transport in other_transports]
    async with Processes(settings.work_dir) as procs:
        handler = await procs.handler()
        await warm_up(handler)
        bare = await bare_baselines(settings, handler)

        async def measure(system: str, args: tuple[str, ...]) -> Run:
            return await measure_processor(settings, procs, handler, system=system,
                                           items=sizes.http_items, args=args)

        ours = await best_of_interleaved(systems, measure)
    aiohttp_run = bare[0]
    headline = ratio(ours[0].per_second, aiohttp_run.per_second)
    for run in [*ours, *bare]:
        outcome.rows.append(Row(run.system, rate_text(run.per_second, "req/s"), run.detail()))
    if headline is not None:
        outcome.rows.append(Row("ratio processor / bare aiohttp", f"{headline:.2f}x",
                                f"concurrency {sizes.concurrency} for all"))
    outcome.figures = {
        "items": sizes.http_items, "concurrency": sizes.concurrency,
        "partitions": sizes.partitions, "handler": "raw ASGI, uvicorn (h11, asyncio loop)",
        "processor": [run.as_json() for run in ours],
        "bare": [run.as_json() for run in bare],
        "ratio_processor_over_bare_aiohttp": None if headline is None else round(headline, 3),
    }
    outcome.goals.append(ratio_goal("HTTP per-item: processor vs bare aiohttp", headline, 0.5))
    return outcome


async def run_batch(settings: Settings) -> Outcome:
    """The HTTP batch scenario (see the module docstring); skipped without the flag."""
    sizes = settings.sizes
    outcome = Outcome("batch", TITLE_BATCH)
    if BATCH_OPTION not in await processor_help():
        outcome.status = "skipped"
        outcome.reason = f"not available: processor run has no {BATCH_OPTION} option"
        outcome.rows.append(Row("processor run --handler-batch-size", "not available",
                                f"this build's `processor run --help` lists no {BATCH_OPTION}"))
        outcome.goals.append(ratio_goal("HTTP batch vs bare per-item", None, 2.0))
        outcome.figures = {"available": False}
        return outcome
    async with Processes(settings.work_dir) as procs:
        handler = await procs.handler()
        await warm_up(handler)
        bare = await bare_baselines(settings, handler)
        batch = best_round([await measure_processor(
            settings, procs, handler,
            system=f"processor run --handler-batch-size {sizes.batch_size}",
            items=sizes.batch_items,
            args=("--concurrency", str(sizes.batch_concurrency),
                  BATCH_OPTION, str(sizes.batch_size)))
            for _ in range(max(settings.rounds, sizes.headline_rounds))])
    best = max(bare, key=lambda run: run.per_second)
    headline = ratio(batch.per_second, best.per_second)
    outcome.rows.append(Row(batch.system, rate_text(batch.per_second),
                            batch.detail() + f"; concurrency {sizes.batch_concurrency}"))
    for run in bare:
        outcome.rows.append(Row(f"{run.system} (per item)", rate_text(run.per_second),
                                run.detail() + f"; concurrency {sizes.concurrency}"))
    if headline is not None:
        outcome.rows.append(Row("ratio batch / best bare per-item", f"{headline:.2f}x",
                                f"best: {best.system}"))
    outcome.figures = {
        "available": True, "items": sizes.batch_items, "batch_size": sizes.batch_size,
        "concurrency": sizes.batch_concurrency, "processor": batch.as_json(),
        "bare_per_item": [run.as_json() for run in bare],
        "ratio_batch_over_best_bare": None if headline is None else round(headline, 3),
    }
    outcome.goals.append(ratio_goal("HTTP batch vs bare per-item", headline, 2.0))
    return outcome
