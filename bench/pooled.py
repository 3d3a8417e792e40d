"""The scale curve: 1, 2, 4, 8 and 16 processors on one PostgreSQL, direct and through
PgBouncer in transaction mode.

Each size drains the same items (``pooled_partitions`` x ``pooled_items``, a fresh table
prefix each time) with K processor processes (:mod:`bench.fleet_worker`, as the fleet
scenario runs them: one watcher each at the default settings, a no-op processor, all
connected before the go): first with the processors connected to PostgreSQL directly,
then through PgBouncer (``$PROCESSOR_BENCH_POOLED_URL``, by default
``postgresql://postgres@127.0.0.1:6432/test?pooler=transaction``, which
``python3 -m tests.support.pgbouncer`` starts). Per size: items per second, the
processors' CPU per item, and the CPU per item of the database's processes (every
``postgres`` process on this machine, so a neighbour's load shows too) and of PgBouncer,
read from ``/proc`` at the go and at the end. Over the rounds, throughput is the
fastest drain's and CPU per item the cheapest drain's.

A direct size is not run when its processors would need more sessions than the server
has free (``max_connections`` less the reserved ones and those in use): each processor
holds its engine pool's and its hot path's connections, measured at the end of the
largest direct drain so far (server sessions at the end, per processor, are in the
table). That is the limit a pooler lifts: through PgBouncer the server sees at most its
``default_pool_size`` sessions whatever the fleet's size.

Goals: CPU per item with 8 processors at most 1.15x one processor's, direct and pooled;
throughput grows until the machine's cores are the limit, then holds: 16 processors
drain at 0.9x the best size's rate at least. With the database on the same machine, its
cores are the processors' too: the table says how many of them each size kept busy.
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path

from bench.common import Goal, Outcome, Row, Settings, libpq_url, rate_text
from bench.fleet import Probe, fleet_drain

POOLED_URL_ENV = "PROCESSOR_BENCH_POOLED_URL"
DEFAULT_POOLED_URL = "postgresql://postgres@127.0.0.1:6432/test?pooler=transaction"
CPU_GOAL = 1.15  # CPU per item with 8 processors / with 1, at most
HOLD_GOAL = 0.9  # throughput with the most processors / the best size's, at least
START = "python3 -m tests.support.pgbouncer (after apt-get install pgbouncer)"
TITLE = ("Scale curve (PostgreSQL, direct and through PgBouncer): {partitions} partitions x "
         "{items:,} items drained by {sizes} processors")
TICKS = os.sysconf("SC_CLK_TCK")


def pooled_url() -> str:
    """The benchmark's PgBouncer URL: ``$PROCESSOR_BENCH_POOLED_URL`` or the local one."""
    return os.environ.get(POOLED_URL_ENV, DEFAULT_POOLED_URL)


def _cpu_seconds(pid: int) -> tuple[str, float] | None:
    """The command name and CPU seconds (user + system) of process ``pid``; None when
    it has ended."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, rest = text.rpartition(") ")
    fields = rest.split()
    return head.split(" (", 1)[-1], (int(fields[11]) + int(fields[12])) / TICKS


def cpu_of(command: str) -> dict[int, float]:
    """The CPU seconds of every running process named ``command``, by process id."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        read = _cpu_seconds(int(entry.name))
        if read is not None and read[0] == command:
            found[int(entry.name)] = read[1]
    return found


def sessions_cpu(db_url: str, name: str) -> dict[int, float]:
    """The CPU seconds of the server processes of the database sessions whose
    ``application_name`` starts with ``name-`` (the fleet's processors name theirs after
    themselves; PgBouncer passes a client's name to the server session it lends), by
    process id. The server must run on this machine."""
    import psycopg

    with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
        pids = [int(row[0]) for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
            (f"{name}-%",)).fetchall()]
    found = {}
    for pid in pids:
        read = _cpu_seconds(pid)
        if read is not None:
            found[pid] = read[1]
    return found


class SessionsProbe:
    """A fleet drain's probe of the database sessions serving processors named
    ``name-...``: at the go, every server process (a session PgBouncer lends may take
    the name only later, so its CPU until the go must be known whatever its name); at
    the end, the sessions with the name."""

    def __init__(self, db_url: str, name: str) -> None:
        self.db_url = db_url
        self.name = name
        self.started = False

    def __call__(self) -> dict[int, float]:
        if not self.started:
            self.started = True
            return cpu_of("postgres")
        return sessions_cpu(self.db_url, self.name)


# Sessions a processor is assumed to hold before a direct drain has measured it.
FIRST_GUESS_SESSIONS = 4
SESSIONS_SQL = ("SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'client backend'")
ROOM_SQL = ("SELECT current_setting('max_connections')::int "
            "- current_setting('superuser_reserved_connections')::int")


def server_sessions(db_url: str) -> int:
    """The client sessions the PostgreSQL server at ``db_url`` has now (every database's)."""
    import psycopg

    with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
        row = conn.execute(SESSIONS_SQL).fetchone()
    return int(row[0]) - 1 if row else 0  # not this one


def session_room(db_url: str) -> int:
    """How many more client sessions the server at ``db_url`` takes now."""
    import psycopg

    with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
        row = conn.execute(ROOM_SQL).fetchone()
    return (int(row[0]) if row else 0) - server_sessions(db_url)


async def _pooler_problem(url: str) -> str | None:
    """None when statefeed can work through ``url``; otherwise why not."""
    from watcher import Store

    store = Store.open(url)
    try:
        async with asyncio.timeout(10):
            await store.ping()
        return None
    except Exception as error:  # any failure: the pooled half is not run
        return (f"PgBouncer does not answer at {store.engine.url.render_as_string()} "
                f"({type(error).__name__}); start it: {START}")
    finally:
        await store.close()


async def run(settings: Settings) -> Outcome:
    """The scale curve (see the module docstring)."""
    sizes = settings.sizes
    counts = sizes.pooled_processors
    outcome = Outcome("pooled", TITLE.format(
        partitions=sizes.pooled_partitions, items=sizes.pooled_items,
        sizes=", ".join(str(count) for count in counts)))
    url = pooled_url()
    problem = await _pooler_problem(url)
    modes = ("direct",) if problem else ("direct", "pooled")
    runs: dict[str, dict[int, list[dict[str, float | int]]]] = {
        mode: {count: [] for count in counts} for mode in modes}
    skipped: dict[int, str] = {}
    per_processor = float(FIRST_GUESS_SESSIONS)
    for _ in range(settings.rounds):  # interleaved; the best of each counts
        for count in counts:
            for mode in modes:
                if mode == "direct":
                    room = await asyncio.to_thread(session_room, settings.db_url)
                    if per_processor * count > room:
                        skipped[count] = (
                            f"{count} processors would hold about {per_processor * count:.0f} "
                            f"sessions (the largest direct drain held {per_processor:.1f} a "
                            f"processor); the server has {room} free")
                        continue
                probes: dict[str, Probe] = {"database": SessionsProbe(settings.db_url, mode)}
                if mode == "pooled":
                    probes["pooler"] = functools.partial(cpu_of, "pgbouncer")
                run = await fleet_drain(
                    settings, count, worker_url=url if mode == "pooled" else None,
                    partitions=sizes.pooled_partitions, items=sizes.pooled_items,
                    name=mode, probes=probes)
                run["sessions_at_end"] = run["database_processes_at_end"]
                run["sessions_per_processor"] = round(float(run["sessions_at_end"]) / count, 1)
                runs[mode][count].append(run)
                if mode == "direct":
                    per_processor = max(per_processor, float(run["sessions_per_processor"]))
    cores = os.cpu_count() or 1
    for mode in modes:
        for count in list(runs[mode]):
            if not runs[mode][count]:
                del runs[mode][count]
                outcome.rows.append(Row(f"{mode}, {count} processors", "not run",
                                        skipped.get(count, "")))
        counts_run = tuple(runs[mode])
        best = {count: max(found, key=lambda run: run["items_per_s"])
                for count, found in runs[mode].items()}
        cheapest = {count: min(found, key=lambda run: run["cpu_us_per_item"])
                    for count, found in runs[mode].items()}
        one = float(cheapest[1]["cpu_us_per_item"])
        curve: dict[str, object] = {
            str(count): {"status": "not run", "reason": skipped.get(count, "")}
            for count in counts if count not in counts_run}
        for count in counts_run:
            run, cheap = best[count], cheapest[count]
            busy = (float(run["cpu_us_per_item"]) + float(run["database_cpu_us_per_item"])
                    + float(run.get("pooler_cpu_us_per_item", 0.0))) * float(
                        run["items_per_s"]) / 1e6
            pooler = (f"; PgBouncer {cheap['pooler_cpu_us_per_item']:,.1f} us/item"
                      if mode == "pooled" else "")
            # Through PgBouncer the server sessions are its pool's, whoever opened them.
            sessions = (f" ({run['sessions_per_processor']} a processor)"
                        if mode == "direct" else "")
            outcome.rows.append(Row(
                f"{mode}, {count} processor{'s' if count > 1 else ''}",
                rate_text(float(run["items_per_s"])),
                f"CPU {cheap['cpu_us_per_item']:,.1f} us/item "
                f"({float(cheap['cpu_us_per_item']) / one:.2f}x one's); database "
                f"{cheap['database_cpu_us_per_item']:,.1f} us/item{pooler}; "
                f"{busy:.2f} of {cores} cores busy; {run['sessions_at_end']} server "
                f"sessions at the end{sessions}; items per processor "
                f"{run['items_by_processor']}"))
            curve[str(count)] = {
                "items_per_s": run["items_per_s"], "cpu_us_per_item": cheap["cpu_us_per_item"],
                "database_cpu_us_per_item": cheap["database_cpu_us_per_item"],
                "pooler_cpu_us_per_item": cheap.get("pooler_cpu_us_per_item"),
                "cores_busy": round(busy, 2), "leases_stolen": run["leases_stolen"],
                "sessions_at_end": run["sessions_at_end"],
                "sessions_per_processor": run["sessions_per_processor"],
                "items_by_processor": run["items_by_processor"],
                "rounds_items_per_s": [found["items_per_s"] for found in runs[mode][count]]}
        top = max(counts_run)
        eight = 8 if 8 in counts_run else top
        ratio = float(cheapest[eight]["cpu_us_per_item"]) / one
        peak = max(counts_run, key=lambda count: float(best[count]["items_per_s"]))
        hold = float(best[top]["items_per_s"]) / float(best[peak]["items_per_s"])
        outcome.figures[mode] = {
            "curve": curve, f"ratio_cpu_per_item_{eight}_over_1": round(ratio, 3),
            "peak_processors": peak, f"ratio_throughput_{top}_over_peak": round(hold, 3)}
        outcome.goals.append(Goal(f"{mode}: CPU per item, {eight} processors / 1",
                                  f"<= {CPU_GOAL:g}x", f"{ratio:.2f}x", ratio <= CPU_GOAL))
        outcome.goals.append(Goal(
            f"{mode}: throughput with {top} processors / the peak ({peak})",
            f">= {HOLD_GOAL:g}x", f"{hold:.2f}x", hold >= HOLD_GOAL))
    outcome.figures.update(partitions=sizes.pooled_partitions, items=sizes.pooled_items,
                           processors=list(counts), cores=cores)
    if problem:
        outcome.figures["pooled"] = {"status": "not run", "reason": problem}
        outcome.rows.append(Row("pooled", "not run", problem))
    return outcome
