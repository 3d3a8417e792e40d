"""The metrics as an operator's Prometheus and Grafana see them, from ``processor run``
subprocesses calling a real handler (uvicorn on loopback) on a real SQLite database:

- the Grafana dashboard (``deploy/grafana/statefeed-dashboard.json``) queries only
  metrics, and groups only by labels, that a real scrape has; the scrape is taken under
  load (calls in flight) after items of every kind were processed, so the labelled
  series exist;
- ``promtool check metrics`` (Debian's prometheus package) passes on that scrape, and
  prometheus-client's parser reads it;
- a scrape right after start, before the database answers, shows only what is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import handlers
from processor import AsyncClient, NewItem
from tests.acceptance.harness.processes import FAST, Processor, spawn
from tests.conftest import require_promtool
from tests.support.engine import wait_until
from tests.support.servers import free_port, serve_app
from watcher.store.db.migrate import upgrade

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "statefeed-dashboard.json"
# Labels Prometheus adds to every series it scrapes: not in the exposition itself.
TARGET_LABELS = {"job", "instance"}
# What the dashboard must show, one metric each at least (the panels an operator
# reads: throughput, backlog, errors, leases, latency).
SHOWN = {"statefeed_items_total", "statefeed_handler_seconds_bucket", "statefeed_in_flight",
         "statefeed_items_waiting", "statefeed_oldest_waiting_item_seconds",
         "statefeed_leases_held", "statefeed_lease_events_total",
         "statefeed_gate_advances_total", "statefeed_partitions_closed_total",
         "statefeed_reduce_calls_total", "statefeed_key_in_flight",
         "statefeed_calls_throttled_total", "statefeed_keys_paused",
         "statefeed_partitions_unserved"}
HELD = 3
WAIT = 30.0

# Sample name -> (labels, value) of each of its samples.
Samples = dict[str, list[tuple[dict[str, str], float]]]


# -- the dashboard -------------------------------------------------------------------

def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' and its variables'."""
    document = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in document["panels"]
               for target in panel.get("targets", [])]
    for variable in document["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    return queries


def metric_names(query: str) -> set[str]:
    return set(re.findall(r"\bstatefeed_[a-z0-9_]+", query))


def grouping_labels(query: str) -> set[str]:
    """The labels of every ``by (...)`` in ``query``."""
    return {label.strip() for group in re.findall(r"\bby\s*\(([^)]*)\)", query)
            for label in group.split(",") if label.strip()}


def parse(scrape: str) -> Samples:
    """The samples of a scrape, read by prometheus-client's parser."""
    samples: Samples = {}
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def promtool_check(scrape: str) -> None:
    """``promtool check metrics`` on ``scrape``: no problem reported."""
    done = subprocess.run([require_promtool(), "check", "metrics"], input=scrape,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        done.returncode, done.stdout, done.stderr)


def test_the_dashboard_is_a_grafana_dashboard_of_every_topic() -> None:
    document = json.loads(DASHBOARD.read_text())
    panels = document["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels), "panel ids are unique"
    for panel in panels:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        if panel["type"] != "row":
            assert panel["title"] and panel["targets"], panel
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    shown = set().union(*map(metric_names, dashboard_queries()))
    assert SHOWN <= shown, f"no panel shows {sorted(SHOWN - shown)}"


# -- a processor under load ----------------------------------------------------------

class Handler:
    """Steps that complete, advance, loop, retry and fail, a reduce, and ``hold`` items
    whose calls wait until :attr:`release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.held = 0

    async def step(self, item: handlers.Item) -> handlers.Result:
        if item.id.startswith("hold"):
            self.held += 1
            await self.release.wait()
            return handlers.Result(done=True)
        if item.id == "fail":
            raise handlers.Fail("unreadable")
        if item.id == "retry" and item.attempt == 1:
            raise handlers.Retry("busy")
        if item.id == "loop" and not item.data:  # runs once more at the same gate
            return handlers.Result(data="again")
        return handlers.Result(gate=1) if item.gate == 0 else handlers.Result(done=True)

    def reduce(self, page: handlers.ReducePage) -> handlers.Reduced:
        return handlers.Reduced(result={"count": len(page.items)})


@contextlib.asynccontextmanager
async def processor_run(tmp_path: Path, owner: str, *args: str) -> AsyncIterator[Processor]:
    """``processor run`` with a health port for the block; SIGTERMed at its end (exit 0)."""
    port = free_port()
    proc = await spawn(owner, ["run", "--owner-id", owner, "--health-port", str(port),
                               *FAST, *args], tmp_path, health_port=port)
    try:
        await wait_until(lambda: proc.answer("/metrics"), timeout=WAIT,
                         message="the metrics served")
        yield proc
    except AssertionError as error:
        raise AssertionError(f"{error}\n--- its log:\n{proc.stderr()[-3000:]}") from None
    finally:
        code = await proc.terminate()
    assert code == 0 and "Traceback" not in proc.stderr(), proc.stderr()[-3000:]


async def scrape_under_load(tmp_path: Path) -> str:
    """A scrape of a processor that finished partitions of every kind and has
    :data:`HELD` calls in flight."""
    db_url = f"sqlite:///{tmp_path / 'statefeed.db'}"
    upgrade(db_url, "")
    handler = Handler()
    app = handlers.app(handler.step, reduce=handler.reduce)
    async with AsyncClient(db_url) as client, serve_app(app) as url:
        await client.create_partition("steps", [
            *(NewItem(f"s{n}", b"") for n in range(5)), NewItem("retry", b""),
            NewItem("loop", b"")])
        await client.create_partition("fails", [NewItem("ok", b""), NewItem("fail", b"")])
        await client.create_partition("reduced", [NewItem(f"r{n}", b"") for n in range(3)],
                                      reduce_gates=[1])
        # Under a key with a limit (the default of --max-inflight-per-key): its series.
        await client.create_partition("held", [NewItem(f"hold{n}", b"") for n in range(HELD)],
                                      key="tenant-a")
        await client.create_partition("paused", key="tenant-b")
        await client.pause_key("tenant-b")
        async with processor_run(tmp_path, "scraped", "--db-url", db_url, "--handler-url",
                                 f"{url}/", "--backlog-interval", "0.2",
                                 "--max-inflight-per-key", "10") as proc:
            for partition, status in (("steps", "complete"), ("fails", "failed"),
                                      ("reduced", "complete")):
                assert (await client.wait(partition, timeout=WAIT)).status == status

            async def under_load() -> str | None:
                text = (await proc.get("/metrics")).text
                samples = parse(text)
                ready = ("statefeed_oldest_waiting_item_seconds" in samples
                         and ({"status": "failed"}, 1.0) in samples["statefeed_partitions"]
                         and ({"key": "tenant-a"}, HELD) in samples.get(
                             "statefeed_key_in_flight", [])
                         and samples.get("statefeed_keys_paused") == [({}, 1.0)])
                return text if ready and samples["statefeed_in_flight"] == [({}, HELD)] else None

            scrape = await wait_until(under_load, timeout=WAIT,
                                      message="a scrape with the held calls in flight")
            assert handler.held == HELD
            handler.release.set()
            assert (await client.wait("held", timeout=WAIT)).status == "complete"
    return scrape


async def scrape_before_the_database(tmp_path: Path) -> str:
    """A scrape of a processor waiting for a database that does not answer (nothing
    listens on its port)."""
    nowhere = f"postgresql://statefeed@127.0.0.1:{free_port()}/statefeed"
    async with processor_run(tmp_path, "early", "--db-url", nowhere, "--handler-url",
                             "http://127.0.0.1:9/") as proc:
        await proc.wait_log("action=database_wait", timeout=WAIT)
        return (await proc.get("/metrics")).text


# Each scrape is taken once (a processor run each) and checked by several tests.
@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> str:
    return asyncio.run(scrape_under_load(tmp_path_factory.mktemp("loaded")))


@pytest.fixture(scope="module")
def early(tmp_path_factory: pytest.TempPathFactory) -> str:
    return asyncio.run(scrape_before_the_database(tmp_path_factory.mktemp("early")))


def test_the_dashboard_queries_what_a_loaded_processor_exports(loaded: str) -> None:
    samples = parse(loaded)
    for outcome in ("complete", "advanced", "looped", "retry", "failed"):
        assert outcome in {labels.get("outcome") for labels, _ in
                           samples["statefeed_items_total"]}, outcome
    for query in dashboard_queries():
        names = metric_names(query)
        missing = names - set(samples)
        assert not missing, f"{query}: {sorted(missing)} not in the scrape:\n{loaded}"
        labels = {label for name in names for sample, _ in samples[name] for label in sample}
        unknown = grouping_labels(query) - labels - TARGET_LABELS
        assert not unknown, f"{query}: no sample has the label(s) {sorted(unknown)}"


def test_a_scrape_before_the_database_answers_shows_only_what_is_known(early: str) -> None:
    """The processor waits for its database and serves /metrics meanwhile, with its
    build, nothing in flight, no lease, and no backlog gauge, outcome or lease event,
    rather than zeros that are not true."""
    samples = parse(early)
    ((build, one),) = samples["statefeed_build_info"]
    assert set(build) == {"version", "python"} and build["version"] and one == 1.0
    assert samples["statefeed_in_flight"] == [({}, 0.0)]
    assert samples["statefeed_leases_held"] == [({}, 0.0)]
    never = {"statefeed_partitions", "statefeed_items_waiting",
             "statefeed_oldest_waiting_item_seconds", "statefeed_items_total",
             "statefeed_handler_seconds_count", "statefeed_lease_events_total",
             "statefeed_partitions_closed_total", "statefeed_reduce_calls_total"}
    assert not never & set(samples), sorted(never & set(samples))


@pytest.mark.parametrize("which", ["loaded", "early"])
def test_promtool_finds_no_problem_in_the_scrapes(which: str,
                                                  request: pytest.FixtureRequest) -> None:
    """``promtool check metrics`` (its lint: names, suffixes, help, types) passes on the
    scrape under load and on the one before the database answers."""
    require_promtool()
    promtool_check(request.getfixturevalue(which))
