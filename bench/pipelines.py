"""Pipelines: what routing costs per item, and ten pipelines on one processor against one.

``processor run`` drains ``http_items`` items over ``partitions`` partitions in HTTP
per-item mode (one request an item, at the default concurrency), three ways, taking
turns so a slow moment hits them alike (the best of the rounds counts), over at least
ten partitions:

- one pipeline through ``--handler-url``: the ``default`` pipeline, every gate to one URL;
- one pipeline through a routes file (``--routes``), every gate to that URL: what
  finding a call's route costs against no routes file;
- ten pipelines through one routes file, each with a service (a URL) of its own: its
  own outage hold and session (the connections are one shared pool), as a fleet serving
  ten pipelines has. Partition
  k is in pipeline k mod 10.

All three feed the same handler process, which times the requests as the HTTP scenario
does. The goal: ten pipelines keep at least 0.9x the items per second of one.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.common import Outcome, Row, Settings, rate_text, ratio, ratio_goal
from bench.http_mode import Run, best_of_interleaved, measure_processor, warm_up
from bench.procs import Handler, Processes

TITLE = "Pipelines ({database}): routing's cost, and ten pipelines on one processor"
PIPELINES = 10
TEN_PIPELINES_GOAL = 0.9  # ten pipelines' items/s over one pipeline's, at least


def routes_text(handler: Handler, names: list[str]) -> str:
    """A routes file of the pipelines ``names``, each every gate to a URL of its own on
    ``handler`` (the query string tells them apart)."""
    return "".join(f'[[pipeline]]\nname = "{name}"\n\n'
                   f'[[pipeline.route]]\ngate = "*"\nurl = "{handler.url}/?service={number}"\n\n'
                   for number, name in enumerate(names))


async def run(settings: Settings) -> Outcome:
    """The pipelines scenario (see the module docstring)."""
    # Every pipeline gets a partition at least (partition k is in pipeline k mod 10).
    settings = replace(settings, sizes=settings.sizes.with_(
        partitions=max(settings.sizes.partitions, PIPELINES)))
    sizes = settings.sizes
    outcome = Outcome("pipelines", TITLE.format(database=settings.database_title))
    concurrency = ("--concurrency", str(sizes.concurrency))
    rounds = max(settings.rounds, sizes.headline_rounds)
    async with Processes(settings.work_dir) as procs:
        handler = await procs.handler()
        await warm_up(handler)
        one_file = Path(settings.work_dir) / "routes-one.toml"
        ten_file = Path(settings.work_dir) / "routes-ten.toml"
        one_file.write_text(routes_text(handler, ["default"]))
        ten_file.write_text(routes_text(handler, [f"pl{number}" for number in range(PIPELINES)]))
        plan = [("one pipeline (--handler-url)", "url", rounds),
                ("one pipeline (routes file)", "one", rounds),
                (f"{PIPELINES} pipelines (routes file, a service each)", "ten", rounds)]

        async def measure(system: str, how: str) -> Run:
            if how == "url":
                return await measure_processor(settings, procs, handler, system=system,
                                               items=sizes.http_items, args=concurrency)
            routes = one_file if how == "one" else ten_file
            return await measure_processor(
                settings, procs, handler, system=system, items=sizes.http_items,
                args=(*concurrency, "--routes", str(routes)), routed=True,
                pipeline=None if how == "one" else (lambda number: f"pl{number % PIPELINES}"))

        url_run, one_run, ten_run = await best_of_interleaved(plan, measure)
    routing = ratio(one_run.per_second, url_run.per_second)
    ten = ratio(ten_run.per_second, url_run.per_second)
    for each in (url_run, one_run, ten_run):
        outcome.rows.append(Row(each.system, rate_text(each.per_second), each.detail()))
    outcome.rows += [
        Row("routes file / --handler-url, one pipeline",
            "-" if routing is None else f"{routing:.2f}x", "routing's cost per item"),
        Row(f"{PIPELINES} pipelines / one pipeline",
            "-" if ten is None else f"{ten:.2f}x", f"goal >= {TEN_PIPELINES_GOAL:g}x"),
    ]
    outcome.figures = {
        "items": sizes.http_items, "partitions": sizes.partitions,
        "concurrency": sizes.concurrency, "pipelines": PIPELINES,
        "handler_url": url_run.as_json(), "one_routed": one_run.as_json(),
        "ten_pipelines": ten_run.as_json(),
        "ratio_routes_over_handler_url": None if routing is None else round(routing, 3),
        "ratio_ten_over_one": None if ten is None else round(ten, 3),
    }
    outcome.goals.append(ratio_goal(f"pipelines: {PIPELINES} pipelines vs one (items/s)", ten,
                                    TEN_PIPELINES_GOAL))
    return outcome
