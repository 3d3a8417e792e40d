"""The chord scenario's HTTP handler: the workload of :mod:`bench.ranking` with the handlers SDK.

``handlers.app(step, reduce=handlers.Reduce(fold=..., apply=..., result=...))``,
served by uvicorn in its own process for ``processor run``:

- ``POST /``: gate 0 scores the item and moves it to the reduce gate 1;
- ``POST /reduce``: folds every score of the partition, answers the top items
  with their rank (the others complete), and stores the summary as the
  partition result, stamped with the ``time.monotonic()`` at which it was
  made (one clock for every process on the machine). A gate of one page
  comes in one call, so the stamp is taken when the whole reduce is done.

    python -m bench.chord_handler --port 8123
"""

from __future__ import annotations

import time
from typing import Any

import handlers
from bench.handler_app import serve
from bench.ranking import Accumulator, fold, ranks, score, summary


async def step(item: handlers.Item) -> handlers.Result:
    """Gate 0: score the item (cheap work, so it runs on the loop, not a thread)."""
    return handlers.Result(gate=1, data={"score": score(item.json()["n"])})


def fold_page(accumulator: Accumulator | None, items: list[handlers.Item]) -> Accumulator:
    """Fold one page's scores into the accumulator."""
    return fold(accumulator, ((item.id, item.json()["score"]) for item in items
                              if not item.failed))


def rank_page(accumulator: Accumulator, items: list[handlers.Item]
              ) -> dict[str, handlers.Result]:
    """Answer the page's top items with their rank; the others complete."""
    ranked = ranks(accumulator)
    return {item.id: handlers.Result(done=True, data={"rank": ranked[item.id]})
            for item in items if item.id in ranked}


def result_of(accumulator: Accumulator) -> dict[str, Any]:
    """The partition result: the summary, and when it was made."""
    return {**summary(accumulator), "done_at": time.monotonic()}


app = handlers.app(step, reduce=handlers.Reduce(fold=fold_page, apply=rank_page,
                                                result=result_of))


def main() -> None:
    """Serve the app on 127.0.0.1:<--port> until terminated."""
    serve(app, "the chord scenario's handler")


if __name__ == "__main__":
    main()
