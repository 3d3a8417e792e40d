"""The benchmark suite runs end to end: ``python -m bench --smoke`` as a subprocess.

No timing thresholds: the figures depend on the machine. The test checks that
every scenario ran, that each wrote the figures its table and goals are made
of, that the comparisons ran against the same amount of work, and that the
run left no tables behind, and no Celery worker or broker queue either (the
Celery side of the chord scenario runs where Redis answers, and is skipped
with its reason where none does; its RabbitMQ setups run where RabbitMQ
answers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect

from tests.conftest import POSTGRES_URL, require_bench_peers, require_mariadb, require_postgres
from watcher.store.db.urls import parse_database_url

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ("library", "flow", "small", "fleet", "pooled", "instructions", "http", "batch",
             "spawn", "ingest", "latency", "failover", "renewals", "rowsize", "scale", "fanin",
             "reduce", "chord", "crawl", "park", "pipelines")
# The flow scenario's drains, by their name in its JSON.
FLOW_SETUPS = ("no_keys", "one_key", "key_limit", "no_keys_half", "key_rates")

# The figures a scenario writes on every database it runs on (dotted paths into its
# JSON object, each a number above zero); batch's where the build has batch mode.
FIGURES = {
    "library": ("statefeed.0.items_per_s", "statefeed.0.statements_per_item",
                "statefeed.0.cpu_us_per_item", "statements_per_item"),
    "flow": (*(f"setups.{setup}.{figure}" for setup in FLOW_SETUPS
               for figure in ("items_per_s", "cpu_us_per_item", "statements_per_item")),
             "ratio_one_key_over_no_keys", "ratio_key_limit_over_no_keys",
             "ratio_key_rates_over_no_keys"),
    "small": ("small.items_per_s", "big.items_per_s", "ratio_small_over_big",
              "cpu_ms_per_small_partition"),
    "http": ("processor.0.items_per_s", "processor.0.all_written_seconds",
             "bare.0.items_per_s", "ratio_processor_over_bare_aiohttp"),
    "batch": ("processor.items_per_s", "ratio_batch_over_best_bare"),
    "ingest": ("client.items_per_s", "api_ndjson.items_per_s", "api_ndjson.api_cpu_us_per_item",
               "ratio_ndjson_over_client", "client_json_size.items_per_s",
               "api_json.items_per_s", "ratio_json_over_client"),
    "latency": ("insert_to_dispatch.p50_ms", "gate_advance.p50_ms"),
    "renewals": (*(f"leases_{count}.{figure}" for count in (32, 128)
                   for figure in ("renewal.p50_ms", "cpu_ms", "statements")),),
    "rowsize": (*(f"{phase}.{figure}" for phase in ("steady", "held")
                  for figure in ("jobs", "updates_per_job", "row_bytes", "bytes_after")),),
    "pipelines": ("handler_url.items_per_s", "one_routed.items_per_s",
                  "ten_pipelines.items_per_s", "ratio_routes_over_handler_url",
                  "ratio_ten_over_one"),
    "scale": ("statements_per_item", "drain.rss_mb.at_10pct", "drain.rss_mb.at_90pct",
              *(f"poll_queries.{query}.{at}.p50_ms" for query in ("items_ready", "leases_free")
                for at in ("at_10pct", "at_90pct")),
              # Smoke sizes: the lease counts' cap (1,000) waiting, then ten times as many.
              *(f"lease_reads.{read}.waiting_{count}.p50_ms"
                for read in ("leases_free", "lease_counts") for count in (1_000, 10_000))),
}

pytestmark = pytest.mark.postgres


def _get(document: dict[str, Any], dotted: str) -> Any:
    value: Any = document
    for key in dotted.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def positive(document: dict[str, Any], *paths: str) -> None:
    """Assert that each dotted path (``statefeed.0.items_per_s``) of ``document`` holds a
    number above zero."""
    for path in paths:
        value = _get(document, path)
        assert isinstance(value, int | float) and value > 0, f"{path} = {value!r}"


def check_pooled(pooled: dict[str, Any], sizes: dict[str, Any]) -> None:
    """The scale curve ran every size, directly and through PgBouncer, on every item (a
    direct size the server has too few sessions for is reported as not run, and why)."""
    for mode in ("direct", "pooled"):
        curve = pooled[mode]["curve"]
        assert set(curve) == {str(count) for count in sizes["pooled_processors"]}
        assert "items_per_s" in curve["1"], curve["1"]
        for figures in curve.values():
            if figures.get("status") == "not run":
                assert mode == "direct" and "sessions" in figures["reason"], figures
                continue
            assert sum(figures["items_by_processor"]) == (
                sizes["pooled_partitions"] * sizes["pooled_items"])
            positive(figures, "items_per_s", "cpu_us_per_item", "cores_busy",
                     "sessions_at_end")
    # PgBouncer's CPU is read in clock ticks: a smoke drain may cost it none.
    assert pooled["pooled"]["curve"]["1"]["pooler_cpu_us_per_item"] >= 0


def tables_left(url: str, prefixes: list[str]) -> list[str]:
    """The tables of the database at ``url`` whose names start with one of ``prefixes``."""
    engine = create_engine(parse_database_url(url).sync_url)
    try:
        with engine.connect() as conn:
            names = inspect(conn).get_table_names()
    finally:
        engine.dispose()
    return sorted(name for name in names if name.startswith(tuple(prefixes)))


# Every scenario once at its smallest: about 3 minutes on an idle 2-core machine, twice
# that under load, and more while the rest of the suite keeps both cores busy
# (valgrind's instruction count is most of it: each of its two drains may take up to
# bench.common.INSTRUMENTED_TIMEOUT).
@pytest.mark.timeout(1020)
def test_smoke_run_writes_every_scenario(tmp_path: Path, pooled_postgres_url: str) -> None:
    require_bench_peers()
    require_postgres()
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--json", str(out)], cwd=REPO,
        capture_output=True, text=True, timeout=960,
        env={**os.environ, "PROCESSOR_BENCH_POSTGRES_URL": POSTGRES_URL, "COLUMNS": "160",
             "PROCESSOR_BENCH_POOLED_URL": pooled_postgres_url})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke" and document["format"] == 1
    scenarios = document["scenarios"]
    assert set(scenarios) == set(SCENARIOS)
    sizes = document["sizes"]
    for name in SCENARIOS:
        allowed = ("ok", "skipped") if name == "batch" else ("ok",)
        assert scenarios[name]["status"] in allowed, (name, scenarios[name])

    library = scenarios["library"]
    assert [run["batch_size"] for run in library["pgqueuer"]] == [10, 100, 10]
    assert all(run["items"] == sizes["items"]
               for run in library["statefeed"] + library["pgqueuer"])
    positive(library, *FIGURES["library"], "pgqueuer.0.items_per_s",
             "ratio_statefeed_over_best_pgqueuer", "ratio_default_statefeed_over_best_pgqueuer")

    check_flow(scenarios["flow"], sizes)

    small = scenarios["small"]
    assert small["small"]["items"] == small["big"]["items"] == (
        sizes["small_partitions"] * sizes["small_items"])
    positive(small, *FIGURES["small"])

    fleet = scenarios["fleet"]
    assert set(fleet["runs"]) == {"1", "2", "4"}
    for run in fleet["runs"].values():
        assert run["items"] == sum(run["items_by_processor"]) == (
            sizes["fleet_partitions"] * sizes["fleet_items"])
    positive(fleet, "runs.1.items_per_s", "runs.4.cpu_us_per_item",
             "ratio_cpu_per_item_4_over_1")

    check_pooled(scenarios["pooled"], sizes)

    instructions = scenarios["instructions"]
    if instructions["status"] == "skipped":
        assert "valgrind" in instructions["reason"], instructions
    else:
        assert instructions["items"] == list(sizes["instructions_items"])
        assert instructions["instructions"][1] > instructions["instructions"][0] > 0
        positive(instructions, "instructions_per_item")

    http = scenarios["http"]
    assert all(run["items"] == sizes["http_items"] for run in http["processor"] + http["bare"])
    assert [run["system"] for run in http["bare"]] == ["bare aiohttp", "bare httpx"]
    positive(http, *FIGURES["http"])

    batch = scenarios["batch"]
    if batch["available"]:
        assert batch["processor"]["items"] == sizes["batch_items"]
        # Batches, not one request per item.
        assert batch["processor"]["requests"] < batch["processor"]["items"]
        positive(batch, *FIGURES["batch"])

    latency = scenarios["latency"]
    for key in ("insert_to_dispatch", "gate_advance"):
        assert latency[key]["samples"] == sizes["latency_samples"]
        assert 0 < latency[key]["p50_ms"] <= latency[key]["p99_ms"]

    failover = scenarios["failover"]
    positive(failover, "failover_after_kill_s", "handoff_after_sigterm_s",
             "lease_duration_s", "partitions_moved_on_kill", "partitions_moved_on_sigterm",
             "start_to_first_lease_s", "start_to_first_lease_last_s")
    assert failover["start_to_first_lease_s"] <= failover["start_to_first_lease_last_s"]
    assert failover["handoff_exit_code"] == 0

    scale = scenarios["scale"]
    assert scale["drain"]["items"] == sizes["scale_partitions"] * sizes["scale_items"]
    positive(scale, *FIGURES["scale"])
    positive(scenarios["rowsize"], *FIGURES["rowsize"])

    fanin = scenarios["fanin"]
    assert fanin["items_per_gate"] == sizes["fanin_items"]
    # A gate bigger than a reduce page: both passes ran (and the warm-up's one call).
    assert {"all", "fold", "apply"} <= set(fanin["reduce_calls"])
    for key in ("to_reduce_called", "to_reduce_answered", "to_complete"):
        assert fanin[key]["samples"] == sizes["fanin_samples"]
        assert 0 < fanin[key]["p50_ms"] <= fanin[key]["p99_ms"]

    reduce = scenarios["reduce"]
    assert [gate["items"] for gate in reduce["gates"]] == sizes["reduce_gate_items"]
    for number in range(len(reduce["gates"])):
        positive(reduce, *(f"gates.{number}.{figure}" for figure in (
            "seconds", "items_per_s", "cpu_us_per_item", "rss_mb.start", "rss_mb.peak")))
    assert set(reduce["gates"][-1]["calls"]) == {"fold", "apply"}
    assert isinstance(reduce["peak_rss_growth"], float)

    chord = scenarios["chord"]
    work = sizes["chord_partitions"] * sizes["chord_items"]
    for system in ("statefeed_library", "statefeed_http"):
        assert chord[system]["items"] == work
        assert chord[system]["partition_latency"]["samples"] == sizes["chord_partitions"]
        positive(chord, f"{system}.steps_per_s", f"{system}.partition_latency.p99_ms")
    celery = chord["celery"]
    if "skipped" in celery:
        assert "Redis" in celery["skipped"] or "Celery" in celery["skipped"], celery
        assert chord["ratio_library_over_best_celery"] is None
    else:
        brokers = celery["brokers"]
        assert brokers[0] == "redis" and set(brokers) | set(celery["brokers_skipped"]) == {
            "redis", "rabbitmq"}, celery
        assert [(run["broker"], run["setup"]) for run in celery["setups"]] == [
            (broker, setup) for broker in brokers for setup in sizes["celery_setups"]]
        for number, run in enumerate(celery["setups"]):
            assert run["items"] == work
            positive(chord, f"celery.setups.{number}.steps_per_s",
                     f"celery.setups.{number}.partition_latency.p99_ms")
        positive(chord, "ratio_library_over_best_celery",
                 "ratio_library_p99_over_best_celery_p99")
        _no_celery_left([(run["broker"], run["queue"]) for run in celery["setups"]])

    spawn = scenarios["spawn"]
    assert spawn["children"] >= sizes["spawn_children"] and spawn["page"] == sizes["spawn_page"]
    positive(spawn, "add_items_per_second", "spawn_per_second", "cost_ratio")

    ingest = scenarios["ingest"]
    # The same items each way, at least three rounds each.
    assert ingest["items"] == ingest["client"]["items"] == ingest["api_ndjson"]["items"] == (
        sizes["ingest_items"])
    assert ingest["json_items"] == ingest["client_json_size"]["items"] == (
        ingest["api_json"]["items"]) == sizes["ingest_json_items"]
    for way in ("client", "api_ndjson", "client_json_size", "api_json"):
        assert len(ingest[way]["rounds_items_per_s"]) >= 3, (way, ingest[way])
    positive(ingest, *FIGURES["ingest"])

    check_park(scenarios["park"], sizes)
    pipelines = scenarios["pipelines"]
    assert pipelines["pipelines"] == 10 and pipelines["partitions"] >= 10, pipelines
    assert {pipelines[way]["items"] for way in ("handler_url", "one_routed", "ten_pipelines")} == {
        sizes["http_items"]}
    positive(pipelines, *FIGURES["pipelines"])

    crawl = scenarios["crawl"]
    assert crawl["statefeed_library"]["partitions"] == sizes["crawl_count"]
    positive(crawl, "statefeed_library.steps_per_s", "statefeed_library.partition_latency.p99_ms")
    if "skipped" not in crawl["celery"]:
        assert [run["setup"] for run in crawl["celery"]["setups"]] == sizes["celery_setups"]
        positive(crawl, "lead_nodes_per_second", "lead_p99")

    names = {goal["name"] for goal in document["goals"]}
    assert {"library: statefeed vs PGQueuer (best vs best)", "DB statements per item, amortized",
            "HTTP per-item: processor vs bare aiohttp", "HTTP batch vs bare per-item",
            "insert -> first dispatch p50", "gate advance p50",
            "reduce: memory bounded as the gate grows (bench criterion)",
            "chord: statefeed library (defaults) vs best Celery, steps/s",
            "chord: partition p99, statefeed library / best Celery",
            "spawn cost per child vs add_items", "small partitions vs big, items/s",
            "ingest: API NDJSON vs the client's create_partition, items/s",
            "fleet: CPU per item, 4 processors / 1",
            "flow: one key without a limit vs no keys, items/s (bench criterion)",
            "crawl: statefeed vs best Celery, nodes/s",
            "crawl: best Celery p99 / statefeed p99",
            "park: completions/s vs add_items (one a call)",
            "pipelines: 10 pipelines vs one (items/s)"} <= names
    assert {goal["result"] for goal in document["goals"]} <= {"PASS", "MISS", "n/a"}
    assert "Goals" in done.stdout
    assert "PASS" in done.stdout or "MISS" in done.stdout

    # Nothing left behind: every table prefix the run used is gone again.
    assert document["table_prefixes"]
    assert tables_left(POSTGRES_URL, document["table_prefixes"]) == []


def check_park(park: dict[str, Any], sizes: dict[str, Any]) -> None:
    """The park scenario parked, completed through the API and added the same items."""
    assert park["items"] >= sizes["park_items"] - park["partitions"], park
    positive(park, "normal_seconds", "park_seconds", "park_cost_ratio",
             "completions_per_second", "add_items_per_second", "completion_ratio")


@pytest.mark.mariadb
def test_park_smoke_on_every_database(tmp_path: Path) -> None:
    """``python -m bench --smoke --only park`` on SQLite, PostgreSQL and MariaDB: each
    parks, completes every token through ``processor api`` and prints PASS or MISS."""
    require_postgres()
    require_mariadb()
    out = tmp_path / "park.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--only", "park", "--db", "sqlite",
         "--db", "postgres", "--db", "mariadb", "--json", str(out)], cwd=REPO,
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    for database in ("sqlite", "postgres", "mariadb"):
        check_park(document["databases"][database]["scenarios"]["park"], document["sizes"])
    assert "park: completions/s vs add_items" in done.stdout
    assert "PASS" in done.stdout or "MISS" in done.stdout


def check_flow(flow: dict[str, Any], sizes: dict[str, Any]) -> None:
    """The flow scenario drained the same items in every setup, and only the limited one
    wrote key grants, each within its limit."""
    assert flow["status"] == "ok", flow
    setups = flow["setups"]
    assert list(setups) == list(FLOW_SETUPS)
    assert {setup["items"] for setup in setups.values()} == {sizes["flow_items"]}
    positive(flow, *FIGURES["flow"])
    limited = setups["key_limit"]
    assert limited["key_limit"] == flow["key_limit"] == 16
    assert limited["key_grants"] >= 1
    assert 0 < limited["most_slots_granted"] <= limited["key_limit"]
    assert setups["no_keys"]["key_grants"] == setups["one_key"]["key_grants"] == 0
    assert setups["key_rates"]["rate_limit_per_key"] == flow["rate_limit_per_key"] > 0


def _no_celery_left(queues: list[tuple[str, str]]) -> None:
    """No process still serves one of the run's Celery queues, and no broker keeps one of
    them (given as ``(broker, queue)``)."""
    import redis
    from kombu import Connection
    from kombu.exceptions import ChannelError

    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # it exited meanwhile
        assert not any(queue.encode() in words for _, queue in queues), (cmdline, words)
    from bench.celery_app import rabbitmq_url, redis_url

    connection = redis.Redis.from_url(redis_url(), socket_timeout=5)
    try:
        for broker, queue in queues:
            if broker == "redis":
                assert not connection.exists(queue, f"_kombu.binding.{queue}"), queue
    finally:
        connection.close()
    for broker, queue in queues:
        if broker == "rabbitmq":
            with Connection(rabbitmq_url(), connect_timeout=5) as rabbit, \
                    pytest.raises(ChannelError):
                rabbit.channel().queue_declare(queue, passive=True)
