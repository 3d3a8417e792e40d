"""The seeded checker (tests/proof) on a fixed set of seeds per live database: each seed
draws its work and faults, runs them against three ``processor run`` and one
``processor api``, and every guarantee is checked on the history.

A failing seed replays with ``python -m tests.proof run --seed N --db URL`` and shrinks
with ``python -m tests.proof shrink``; a seed that found a defect joins
:data:`FOUND_SEEDS` for ever (docs/how-to/prove.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MARIADB_URL, POSTGRES_URL, require_mariadb, require_postgres
from tests.proof.plan import generate
from tests.proof.runner import run_plan

pytestmark = pytest.mark.processes

# Seeds every CI run checks, per database: each about 25-40 s.
CI_SEEDS: dict[str, list[int]] = {
    "sqlite": [12, 203],
    "postgres": [12, 203],
    "mariadb": [12, 203],
}

# Seeds that found a defect, kept as regression tests; each fails until its fix is in.
FOUND_SEEDS: list[tuple[str, int, str]] = [
    # Quorum: quorum={0: k} over items whose per-item answers ({"gate": 1}) arrive at the
    # same moment are written in one batch and the quorum counted after, so all pass
    # (burst partition b01: 8 items passed gate 0 of quorum 2).
    ("sqlite", 2, "quorum: a batch of simultaneous answers passes more than k"),
    # Quorum: quorum={0: k} over parked items whose completions by token race on
    # PostgreSQL lets more than k through (race partitions r00: 9 of quorum 5, r04: 13).
    ("postgres", 7, "quorum: racing completions by token pass more than k"),
    # Retry-After: a hold on a routed service is not honoured by a processor that has
    # not called that service yet (p2g2, started after a kill -9, calls beta during
    # p1g1's 4 s hold).
    ("sqlite", 36, "retry-after: a processor new to a routed service ignores its hold"),
    # set_gate: a move past a gate where an item waits for a completion was let through,
    # and the partition completed with the parked item left behind (x10/i1, a soak).
    ("postgres", 1268568449, "set_gate: strands an item parked below the new gate"),
]

URLS = {"postgres": POSTGRES_URL, "mariadb": MARIADB_URL}
MARKS = {"postgres": [pytest.mark.postgres], "mariadb": [pytest.mark.mariadb], "sqlite": []}


def _cases() -> list[object]:
    cases = [pytest.param(db, seed, id=f"{db}-{seed}", marks=MARKS[db])
             for db, seeds in CI_SEEDS.items() for seed in seeds]
    cases += [pytest.param(db, seed, id=f"{db}-{seed}-found", marks=MARKS[db])
              for db, seed, _ in FOUND_SEEDS]
    return cases


def _url(db: str, tmp_path: Path) -> str:
    if db == "postgres":
        require_postgres()
    elif db == "mariadb":
        require_mariadb()
    else:
        return f"sqlite:///{tmp_path / 'proof.db'}"
    return URLS[db]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("db", "seed"), _cases())
async def test_a_seed_keeps_every_guarantee(db: str, seed: int, tmp_path: Path) -> None:
    url = _url(db, tmp_path)
    outcome = await run_plan(generate(seed), url, tmp_path / "run")
    if outcome.violations:
        out = tmp_path / f"proof-{seed}.jsonl"
        outcome.history.dump(out)
        shown = "\n".join(str(v) for v in outcome.violations[:10])
        target = "sqlite" if db == "sqlite" else url
        pytest.fail(f"seed {seed} on {db}: {len(outcome.violations)} violations\n{shown}\n"
                    f"history: {out}\nlogs: {tmp_path / 'run'} (each process's stderr: "
                    f"<owner>.err)\nreplay: python -m tests.proof run --seed {seed} "
                    f"--db {target}", pytrace=False)
    assert outcome.history.of("call"), "the run made no call"
