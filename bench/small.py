"""Small partitions: many partitions of a few items each, against the same items in a few
big partitions, on one database.

Both drains are the library scenario's (:func:`bench.library.statefeed_drain`): one
in-process watcher at its defaults drains no-op items, and the clock stops when the
last partition closes. The small run holds ``small_partitions`` partitions of
``small_items`` items (2,000 x 20 by default); the big run holds the same number of
items in ``partitions`` partitions (10). Every partition costs a lease, a gate
summary, a close and a lease release whatever its size, so the small run measures
what statefeed pays per partition: the figure is its rate as a share of the big
run's, and the CPU each partition costs beyond its items (this process's CPU,
the database's not counted).

Goal: the small-partition rate is at least 0.6x the big-partition rate (the engine's
second round; the first asked for half).
"""

from __future__ import annotations

from bench.common import Goal, Outcome, Row, Settings, best_round, rate_text, ratio
from bench.library import Drain, statefeed_drain

TITLE = ("Small partitions ({database}): {partitions:,} x {items} items against "
         "{total:,} items in {big} partitions")
SHARE_GOAL = 0.6  # small-partition rate / big-partition rate, at least


async def run(settings: Settings) -> Outcome:
    """The small-partitions scenario (see the module docstring).

    Raises:
        TimeoutError: a drain did not finish within the phase timeout.
        RuntimeError: a drain left items over or failed them.
    """
    sizes = settings.sizes
    total = sizes.small_partitions * sizes.small_items
    outcome = Outcome("small", TITLE.format(
        database=settings.database_title, partitions=sizes.small_partitions,
        items=sizes.small_items, total=total, big=sizes.partitions))
    small_settings = _with_sizes(settings, items=total, partitions=sizes.small_partitions)
    big_settings = _with_sizes(settings, items=total, partitions=sizes.partitions)
    smalls: list[Drain] = []
    bigs: list[Drain] = []
    for _ in range(settings.rounds):  # interleaved, so a busy moment hits both alike
        smalls.append(await statefeed_drain(small_settings, sizes.concurrency))
        bigs.append(await statefeed_drain(big_settings, sizes.concurrency))
    small, big = best_round(smalls), best_round(bigs)
    share = ratio(small.per_second, big.per_second)
    small_cpu_us = small.extra["cpu_us_per_item"] * total
    big_cpu_us = big.extra["cpu_us_per_item"] * total
    per_partition_us = small_cpu_us / sizes.small_partitions
    beyond_items_us = (small_cpu_us - big_cpu_us) / sizes.small_partitions
    outcome.rows += [
        Row(f"{sizes.small_partitions:,} partitions x {sizes.small_items}",
            rate_text(small.per_second),
            f"{total:,} items in {small.seconds:.2f} s; CPU {small.extra['cpu_us_per_item']:,.0f}"
            f" us/item; {small.extra['statements_per_item']:.3f} statements/item"),
        Row(f"{sizes.partitions} partitions x {total // sizes.partitions:,}",
            rate_text(big.per_second),
            f"{total:,} items in {big.seconds:.2f} s; CPU {big.extra['cpu_us_per_item']:,.0f}"
            f" us/item; {big.extra['statements_per_item']:.3f} statements/item"),
        Row("ratio small / big partitions", "n/a" if share is None else f"{share:.2f}x",
            "the same items and watcher; only the partitions differ"),
        Row("CPU per small partition", f"{per_partition_us / 1000:,.2f} ms",
            f"{beyond_items_us / 1000:,.2f} ms of it beyond what its items cost in big "
            f"partitions"),
    ]
    outcome.figures.update(
        items=total, small_partitions=sizes.small_partitions, small_items=sizes.small_items,
        big_partitions=sizes.partitions, small=small.as_json(), big=big.as_json(),
        ratio_small_over_big=None if share is None else round(share, 3),
        cpu_ms_per_small_partition=round(per_partition_us / 1000, 3),
        cpu_ms_per_partition_beyond_items=round(beyond_items_us / 1000, 3))
    outcome.goals.append(Goal("small partitions vs big, items/s", f">= {SHARE_GOAL:g}x",
                              "n/a" if share is None else f"{share:.2f}x",
                              share is not None and share >= SHARE_GOAL))
    return outcome


def _with_sizes(settings: Settings, *, items: int, partitions: int) -> Settings:
    """``settings`` draining ``items`` over ``partitions`` partitions."""
    from dataclasses import replace

    return replace(settings, sizes=settings.sizes.with_(items=items, partitions=partitions))
