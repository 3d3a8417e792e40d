"""The Celery side of the chord scenario: the app, its step task and its reduce (chord body).

The worker runs this module (``celery -A bench.celery_app worker``); the
benchmark imports it too, to send the chords. Broker and result backend are
the Redis at ``$PROCESSOR_BENCH_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``). JSON only. Results expire after
:data:`RESULT_EXPIRES` seconds, should a run be killed before it deletes them.

The tasks do the work of :mod:`bench.ranking`: ``step(n)`` scores item ``n``,
and the chord body ``reduce(results, partition)`` folds every ``[id, score]``
of the partition into its summary, stamped with the ``time.monotonic()`` at
which it was done (one clock for every process on the machine).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from bench.ranking import fold, item_id, score, summary

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_URL_ENV = "PROCESSOR_BENCH_REDIS_URL"
RESULT_EXPIRES = 600


def redis_url() -> str:
    """The benchmark's Redis: ``$PROCESSOR_BENCH_REDIS_URL`` or the local one."""
    return os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL)


app = Celery("bench_chord", broker=redis_url(), backend=redis_url())
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"],
    result_expires=RESULT_EXPIRES, broker_connection_retry_on_startup=True,
    # Nothing but the tasks: no remote control, events or heartbeats, whose
    # queues and keys would outlive the run.
    worker_enable_remote_control=False, worker_send_task_events=False,
    worker_hijack_root_logger=False)


@app.task(name="bench.step")
def step(number: int) -> list[Any]:
    """Score one item; returns ``[item id, score]``."""
    return [item_id(number), score(number)]


@app.task(name="bench.reduce")
def reduce(results: list[list[Any]], partition: str) -> dict[str, Any]:
    """The chord body: fold every step result of ``partition`` into its summary."""
    folded = summary(fold(None, ((identifier, value) for identifier, value in results)))
    return {"partition": partition, **folded, "done_at": time.monotonic()}
