"""The Celery side of the chord scenario: the app, its step task and its reduce (chord body).

The worker runs this module (``celery -A bench.celery_app worker``); the
benchmark imports it too, to send the chords. The result backend is the Redis
at ``$PROCESSOR_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``); the
broker is that Redis too, or the RabbitMQ at ``$PROCESSOR_BENCH_RABBITMQ_URL``
(default ``amqp://guest:guest@127.0.0.1:5672//``) when
``$PROCESSOR_BENCH_CELERY_BROKER`` is ``rabbitmq``. JSON only. Results expire
after :data:`RESULT_EXPIRES` seconds, should a run be killed before it deletes
them.

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
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
RABBITMQ_URL_ENV = "PROCESSOR_BENCH_RABBITMQ_URL"
BROKER_ENV = "PROCESSOR_BENCH_CELERY_BROKER"  # "redis" (the default) or "rabbitmq"
BROKERS = ("redis", "rabbitmq")
RESULT_EXPIRES = 600
SETTINGS: dict[str, Any] = {
    "task_serializer": "json", "result_serializer": "json", "accept_content": ["json"],
    "result_expires": RESULT_EXPIRES, "broker_connection_retry_on_startup": True,
    # Nothing but the tasks: no remote control, events or heartbeats, whose
    # queues and keys would outlive the run.
    "worker_enable_remote_control": False, "worker_send_task_events": False,
    "worker_hijack_root_logger": False}


def redis_url() -> str:
    """The benchmark's Redis: ``$PROCESSOR_BENCH_REDIS_URL`` or the local one."""
    return os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL)


def rabbitmq_url() -> str:
    """The benchmark's RabbitMQ: ``$PROCESSOR_BENCH_RABBITMQ_URL`` or the local one."""
    return os.environ.get(RABBITMQ_URL_ENV, DEFAULT_RABBITMQ_URL)


def broker_url(broker: str) -> str:
    """The URL of ``broker`` (one of :data:`BROKERS`).

    Raises:
        ValueError: ``broker`` is not one of :data:`BROKERS`.
    """
    if broker not in BROKERS:
        raise ValueError(f"Celery broker {broker!r}: expected one of {', '.join(BROKERS)}")
    return rabbitmq_url() if broker == "rabbitmq" else redis_url()


app = Celery("bench_chord", broker=broker_url(os.environ.get(BROKER_ENV, "redis")),
             backend=redis_url())
app.conf.update(SETTINGS)
_senders: dict[str, Celery] = {}


def sender(broker: str) -> Celery:
    """An app that sends this module's tasks, by name, through ``broker`` (one per broker,
    kept for the process); its results come from the same Redis backend as ``app``'s."""
    if broker not in _senders:
        _senders[broker] = Celery("bench_chord", broker=broker_url(broker), backend=redis_url())
        _senders[broker].conf.update(SETTINGS)
    return _senders[broker]


@app.task(name="bench.step")
def step(number: int) -> list[Any]:
    """Score one item; returns ``[item id, score]``."""
    return [item_id(number), score(number)]


@app.task(name="bench.reduce")
def reduce(results: list[list[Any]], partition: str) -> dict[str, Any]:
    """The chord body: fold every step result of ``partition`` into its summary."""
    folded = summary(fold(None, ((identifier, value) for identifier, value in results)))
    return {"partition": partition, **folded, "done_at": time.monotonic()}


# --------------------------------------------------------------------------- crawl

# A crawl's fan-in, as Celery users build it by hand for a fan-out whose size is known
# only as it runs (a chord's header is fixed when it is sent): two Redis counters per
# crawl. A node adds its children to ``pending`` before it counts itself ``done``; the
# node that makes ``done`` equal ``pending`` is the last, and sends the reduce.


def crawl_children(node: str, depth: int, fanout: int) -> list[str]:
    """The children of ``node`` (``"n"``, ``"n.0"``, ``"n.0.2"``...) in a tree ``depth``
    levels below the root, ``fanout`` per node."""
    return [f"{node}.{n}" for n in range(fanout)] if node.count(".") < depth else []


def _counters(crawl: str) -> tuple[str, str]:
    return f"bench-crawl:{crawl}:pending", f"bench-crawl:{crawl}:done"


def crawl_start(crawl: str, depth: int, fanout: int, queue: str) -> Any:
    """Set a crawl's counters and send its root; returns the root task's result."""
    pending, done = _counters(crawl)
    client = app.backend.client
    client.set(pending, 1)
    client.set(done, 0)
    return crawl_node.apply_async((crawl, "n", depth, fanout, queue), queue=queue)


@app.task(name="bench.crawl_node")
def crawl_node(crawl: str, node: str, depth: int, fanout: int, queue: str) -> None:
    """Visit one node: send its children, count it, and send the reduce if it is last."""
    client = app.backend.client
    pending, done = _counters(crawl)
    children = crawl_children(node, depth, fanout)
    if children:
        client.incrby(pending, len(children))
        for child in children:
            crawl_node.apply_async((crawl, child, depth, fanout, queue), queue=queue,
                                   ignore_result=True)
    finished = client.incr(done)
    if finished == int(client.get(pending)):
        crawl_reduce.apply_async((crawl,), queue=queue)


@app.task(name="bench.crawl_reduce")
def crawl_reduce(crawl: str) -> dict[str, Any]:
    """The crawl's fan-in: how many nodes it visited, stamped with ``time.monotonic()``."""
    client = app.backend.client
    pending, done = _counters(crawl)
    nodes = int(client.get(done))
    client.set(f"bench-crawl:{crawl}:result", f"{nodes} {time.monotonic()}", ex=RESULT_EXPIRES)
    client.delete(pending, done)
    return {"crawl": crawl, "nodes": nodes, "done_at": time.monotonic()}
