"""The fan-out/fan-in workload every reduce scenario runs: score each item, then rank them all.

One definition, three adapters, so the systems compared do the same work:

- the *step* scores one item: ``score(n)``, a cheap deterministic hash of the
  item's number (statefeed moves the item to the reduce gate with its score;
  a Celery step task returns it);
- the *reduce* sees every item's score of a partition: the count, the sum and
  the top :data:`TOP` (score descending, then id), folded page by page when
  the gate is paged (:func:`fold` is associative over pages in id order);
- statefeed's reduce also answers each top item with its rank (the others
  complete by default), so the fan-in writes back to the items, as the
  resume ranking does.

:class:`LibraryRanker` is the reduce of library mode (``Watcher(reduce=...)``),
at the :class:`~watcher.protocol.ReduceCall` level, and records when each
partition's reduce was first called and when its last call was answered.
"""

from __future__ import annotations

import heapq
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from watcher import Result, WorkItem
from watcher.protocol import ReduceCall, ReduceResult

TOP = 10
Accumulator = dict[str, Any]  # {"count": int, "sum": int, "top": [[score, id], ...]}


def score(number: int) -> int:
    """The step's work: a deterministic pseudo-random score of item ``number``."""
    return number * 2_654_435_761 % 1_000_003


def item_id(number: int) -> str:
    """Item ids sort like their numbers (the reduce pages go in id order)."""
    return f"i{number:07d}"


def number_data(number: int) -> bytes:
    """An item's data before the step: its number."""
    return b'{"n":%d}' % number


def score_data(number: int) -> bytes:
    """An item's data at the reduce gate: its score."""
    return b'{"score":%d}' % score(number)


def fold(accumulator: Accumulator | None, scored: Iterable[tuple[str, int]]) -> Accumulator:
    """Fold ``(item id, score)`` pairs into the accumulator (``None``: an empty one)."""
    count, total = (0, 0) if accumulator is None else (accumulator["count"], accumulator["sum"])
    candidates = [] if accumulator is None else [tuple(entry) for entry in accumulator["top"]]
    for identifier, value in scored:
        count += 1
        total += value
        candidates.append((value, identifier))
    top = heapq.nsmallest(TOP, candidates, key=lambda entry: (-entry[0], entry[1]))
    return {"count": count, "sum": total, "top": [list(entry) for entry in top]}


def summary(accumulator: Accumulator) -> dict[str, Any]:
    """The partition result: count, sum and the top ids with their scores, best first."""
    return {"count": accumulator["count"], "sum": accumulator["sum"],
            "top": [[identifier, value] for value, identifier in accumulator["top"]]}


def expected(numbers: Iterable[int]) -> dict[str, Any]:
    """The result a correct reduce stores for the items ``numbers``."""
    return summary(fold(None, ((item_id(n), score(n)) for n in numbers)))


def ranks(accumulator: Accumulator) -> dict[str, int]:
    """Rank (1 = best) of each top item, by id."""
    return {identifier: rank for rank, (_, identifier) in enumerate(accumulator["top"], 1)}


def rank_answers(accumulator: Accumulator, ids: Iterable[str]) -> dict[str, Result]:
    """Library-mode answers for the top items among ``ids`` (the rest complete by default)."""
    ranked = ranks(accumulator)
    return {identifier: Result(done=True, data=b'{"rank":%d}' % ranked[identifier])
            for identifier in ids if identifier in ranked}


async def library_step(item: WorkItem) -> Result:
    """Gate 0 of library mode: score the item and move it to the reduce gate 1."""
    number = json.loads(item.data)["n"]
    return Result(gate=1, data=b'{"score":%d}' % score(number))


class LibraryRanker:
    """The library-mode reduce (any pass), recording when each partition's reduce ran.

    ``first_call[partition]`` is the ``time.monotonic()`` of its first reduce
    call, ``answered[partition]`` that of the moment its last call (the one
    call of a small gate, or the last apply page) returned its answer;
    ``calls`` counts the calls by pass.
    """

    def __init__(self) -> None:
        self.first_call: dict[str, float] = {}
        self.answered: dict[str, float] = {}
        self.calls: Counter[str] = Counter()

    async def __call__(self, call: ReduceCall) -> ReduceResult:
        """Answer one reduce call. Raises KeyError/ValueError on items without a score."""
        self.first_call.setdefault(call.partition_id, time.monotonic())
        self.calls[call.pass_] += 1
        scored = [(item.id, json.loads(item.data)["score"]) for item in call.items
                  if item.status == "available"]
        if call.pass_ == "apply":
            assert call.accumulator is not None
            answer = ReduceResult(items=rank_answers(json.loads(call.accumulator),
                                                     (identifier for identifier, _ in scored)))
        else:
            start = (None if call.pass_ == "all" or call.accumulator is None
                     else json.loads(call.accumulator))
            accumulator = fold(start, scored)
            result = json.dumps(summary(accumulator)).encode()
            if call.pass_ == "fold":
                answer = ReduceResult(accumulator=json.dumps(accumulator).encode(),
                                      result=result if call.last else None)
            else:
                answer = ReduceResult(
                    items=rank_answers(accumulator, (identifier for identifier, _ in scored)),
                    result=result)
        if call.last and call.pass_ != "fold":
            self.answered[call.partition_id] = time.monotonic()
        return answer


def check_result(partition_id: str, stored: Mapping[str, Any] | None, numbers: Iterable[int]
                 ) -> None:
    """Check a stored partition result against the expected one.

    Raises:
        RuntimeError: it differs (the message shows both).
    """
    want = expected(numbers)
    got = None if stored is None else {key: stored.get(key) for key in want}
    if got != want:
        raise RuntimeError(f"partition {partition_id!r}: the reduce stored {stored!r}, "
                           f"expected {want!r}")
