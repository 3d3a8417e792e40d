"""``python -m tests.proof``: run a seed, shrink a failing one, or soak new seeds.

    python -m tests.proof run --seed 123 --db postgresql://postgres@127.0.0.1:5432/test
    python -m tests.proof run --plan shrunk.json --db sqlite:////tmp/proof.db
    python -m tests.proof shrink --seed 123 --db URL [--guarantee quorum-exact]
    python -m tests.proof soak --minutes 10 --db URL

A run writes its history as JSON lines (``--out``, ``proof-<seed>.jsonl`` by default)
and prints every violation with its excerpt; it exits 1 when it found one.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.proof.plan import Plan, generate
from tests.proof.runner import Outcome, run_plan
from tests.proof.shrink import shrink


def _db(url: str, workdir: Path) -> str:
    """``sqlite`` alone means a fresh SQLite file under ``workdir``."""
    return f"sqlite:///{workdir / 'proof.db'}" if url == "sqlite" else url


def report(outcome: Outcome, seconds: float) -> str:
    """The one-line summary of a run."""
    faults = " ".join(f"{k}={v}" for k, v in sorted(outcome.faults().items())) or "none"
    return (f"seed={outcome.plan.seed} {outcome.plan.size()} calls="
            f"{len(outcome.history.of('call'))} completions="
            f"{len(outcome.history.of('completion'))} faults: {faults} "
            f"violations={len(outcome.violations)} seconds={seconds:.1f}")


def keep_logs(workdir: Path, history: Path) -> Path:
    """Copy the processes' logs of a run (``<owner>.err`` and ``.out`` in ``workdir``)
    beside its history (``proof-123.jsonl`` -> ``proof-123.logs/``); returns where."""
    logs = history.with_suffix(".logs")
    logs.mkdir(parents=True, exist_ok=True)
    for log in sorted(workdir.glob("*.err")) + sorted(workdir.glob("*.out")):
        shutil.copy2(log, logs / log.name)
    return logs


def _plan(args: argparse.Namespace) -> Plan:
    return Plan.from_json(Path(args.plan).read_text()) if args.plan else generate(args.seed)


async def _run(args: argparse.Namespace, plan: Plan) -> int:
    with tempfile.TemporaryDirectory(prefix="proof-") as tmp:
        started = time.monotonic()
        outcome = await run_plan(plan, _db(args.db, Path(tmp)), Path(tmp))
        out = Path(args.out or f"proof-{plan.seed}.jsonl")
        await asyncio.to_thread(outcome.history.dump, out)
        print(report(outcome, time.monotonic() - started))
        for violation in outcome.violations:
            print(violation)
        print(f"history: {out}")
        logs = await asyncio.to_thread(keep_logs, Path(tmp), out)
        print(f"logs: {logs} (each process's stderr: <owner>.err)")
    return 1 if outcome.violations else 0


async def _shrink(args: argparse.Namespace, plan: Plan) -> int:
    with tempfile.TemporaryDirectory(prefix="proof-") as tmp:
        counter = iter(range(10_000))

        async def fails(candidate: Plan) -> bool:
            work = Path(tmp) / f"try{next(counter)}"
            outcome = await run_plan(candidate, _db(args.db, work), work)
            names = {v.guarantee for v in outcome.violations}
            print(f"  try {candidate.size()}: {sorted(names) or 'passes'}", flush=True)
            return bool(names) if args.guarantee is None else args.guarantee in names

        smallest = await shrink(plan, fails, budget=args.budget)
    out = Path(args.out or f"proof-{plan.seed}-shrunk.json")
    await asyncio.to_thread(out.write_text, smallest.to_json())
    print(f"shrunk to {smallest.size()}: {out}\nreplay: python -m tests.proof run "
          f"--plan {out} --db {args.db}")
    return 0


async def _soak(args: argparse.Namespace, plan: Plan | None) -> int:
    deadline = time.monotonic() + args.minutes * 60
    seeds = random.Random(args.start)
    totals: dict[str, int] = {}
    checked = failed = 0
    with tempfile.TemporaryDirectory(prefix="proof-") as tmp:
        while time.monotonic() < deadline:
            seed = seeds.randrange(1, 2**31)
            work = Path(tmp) / str(seed)
            started = time.monotonic()
            outcome = await run_plan(generate(seed), _db(args.db, work), work)
            checked += 1
            for kind, count in outcome.faults().items():
                totals[kind] = totals.get(kind, 0) + count
            print(report(outcome, time.monotonic() - started), flush=True)
            if outcome.violations:
                failed += 1
                out = Path(f"proof-{seed}.jsonl")
                await asyncio.to_thread(outcome.history.dump, out)
                for violation in outcome.violations:
                    print(violation)
                logs = await asyncio.to_thread(keep_logs, work, out)
                print(f"history: {out}\nlogs: {logs} (each process's stderr: <owner>.err)")
    faults = " ".join(f"{k}={v}" for k, v in sorted(totals.items()))
    print(f"soak: histories checked={checked} failing={failed} faults: {faults}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.proof", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one seed (or a plan file) and check it")
    shrinking = commands.add_parser("shrink", help="cut a failing seed's plan down")
    for command in (run, shrinking):
        command.add_argument("--seed", type=int, default=1)
        command.add_argument("--plan", help="a plan file (from shrink) instead of a seed")
        command.add_argument("--db", required=True, help="a database URL, or 'sqlite'")
        command.add_argument("--out", help="where to write the history (or shrunk plan)")
    shrinking.add_argument("--guarantee", help="keep only plans that break this guarantee")
    shrinking.add_argument("--budget", type=int, default=40, help="most runs to try")
    soak = commands.add_parser("soak", help="run new seeds for a while")
    soak.add_argument("--minutes", type=float, default=10)
    soak.add_argument("--db", required=True)
    soak.add_argument("--start", type=int, default=None, help="seed of the seeds")
    args = parser.parse_args(argv)
    if args.command == "soak":
        return asyncio.run(_soak(args, None))
    work = {"run": _run, "shrink": _shrink}[args.command]
    return asyncio.run(work(args, _plan(args)))


if __name__ == "__main__":
    sys.exit(main())
