"""The Celery side the chord and crawl scenarios share: its brokers, its workers, its client.

Celery is the peer these scenarios compare with (:mod:`bench.celery_app` holds its
tasks). Redis is its result backend and one broker; RabbitMQ, where it answers, is
the other, and each worker setup runs on both: the better one counts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from bench.common import PYTHON
from bench.procs import Child, Processes

STARTUP_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
RESULT_POLL = 0.5  # the longest a wait for a Celery result goes without checking for a stop
T = TypeVar("T")


def redis_url() -> str:
    """The Redis the Celery side uses (see :mod:`bench.celery_app`)."""
    from bench.celery_app import redis_url as configured  # imports Celery

    return configured()


def shown_url(url: str) -> str:
    """``url`` with any password hidden."""
    from kombu.utils.url import maybe_sanitize_url

    return str(maybe_sanitize_url(url))


def celery_unavailable() -> str | None:
    """None when Celery is installed and Redis (the result backend, and a broker) answers;
    otherwise why the system is skipped."""
    try:
        import celery  # noqa: F401
        import redis
    except ImportError as error:
        return f"Celery not installed ({error.name}); pip install -e '.[bench]'"
    url = redis_url()
    try:
        connection = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            connection.ping()
        finally:
            connection.close()
    except Exception as error:
        return (f"no Redis answers at {shown_url(url)} ({type(error).__name__}: "
                f"{str(error).splitlines()[0][:160] if str(error) else ''}); start "
                "redis-server or set PROCESSOR_BENCH_REDIS_URL")
    return None


def setup_label(setup: str) -> tuple[str, str | None, str]:
    """``"prefork:2"`` -> (pool, concurrency, label ``"prefork, 2 processes"``).

    Raises:
        ValueError: the pool is not one of prefork, threads, solo.
    """
    pool, _, concurrency = setup.partition(":")
    if pool == "solo":
        return pool, None, "solo"
    if pool not in ("prefork", "threads") or not concurrency.isdigit():
        raise ValueError(f"Celery setup {setup!r}: expected prefork:N, threads:N or solo")
    unit = "processes" if pool == "prefork" else "threads"
    return pool, concurrency, f"{pool}, {concurrency} {unit}"


class CeleryClient:
    """Sends chords and reads their results on one thread of its own (Celery's client is
    blocking, and its result backend is per thread). :meth:`stop` makes a wait on that
    thread give up within :data:`RESULT_POLL` s, so an interrupted run never hangs."""

    def __init__(self) -> None:
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="celery")
        self.stopping = threading.Event()

    async def call(self, func: Callable[..., T], *args: Any) -> T:
        """Run ``func(*args)`` on the client's thread."""
        return await asyncio.get_running_loop().run_in_executor(self.thread, func, *args)

    def stop(self) -> None:
        """Make the work on the thread give up, and let the thread go (without waiting)."""
        self.stopping.set()
        self.thread.shutdown(wait=False, cancel_futures=True)


def wait_result(result: Any, deadline: float, stopping: threading.Event) -> Any:
    """``result.get()``, in short waits so that ``stopping`` is seen.

    Raises:
        TimeoutError: the deadline passed first.
        RuntimeError: ``stopping`` was set.
    """
    from celery.exceptions import TimeoutError as ResultTimeout

    while not stopping.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no result for Celery task {result.id} in time")
        with contextlib.suppress(ResultTimeout):
            return result.get(timeout=min(RESULT_POLL, remaining))
    raise RuntimeError("the Celery client was stopped")


def rabbitmq_unavailable() -> str | None:
    """None when RabbitMQ answers; otherwise why the RabbitMQ setups are skipped."""
    from kombu import Connection

    from bench.celery_app import RABBITMQ_URL_ENV, rabbitmq_url

    url = rabbitmq_url()
    try:
        with Connection(url, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as error:
        return (f"no RabbitMQ answers at {shown_url(url)} ({type(error).__name__}: "
                f"{str(error).splitlines()[0][:160] if str(error) else ''}); start "
                f"rabbitmq-server or set {RABBITMQ_URL_ENV}")
    return None


def brokers_available() -> tuple[list[str], dict[str, str]]:
    """The brokers the Celery setups run on (Redis always; RabbitMQ where it answers), and
    why each one left out is."""
    skipped = rabbitmq_unavailable()
    return (["redis"] if skipped else ["redis", "rabbitmq"]), ({"rabbitmq": skipped}
                                                               if skipped else {})


def broker_title(broker: str) -> str:
    """``"redis"`` -> ``"Redis"``, ``"rabbitmq"`` -> ``"RabbitMQ"``."""
    return {"redis": "Redis", "rabbitmq": "RabbitMQ"}.get(broker, broker)


def delete_queue(queue: str, broker: str) -> None:
    """Delete what the broker keeps for ``queue`` (see :func:`_delete_redis_queue`; on
    RabbitMQ the queue and its exchange, which Celery names after it)."""
    if broker == "redis":
        _delete_redis_queue(queue)
        return
    from kombu import Connection

    from bench.celery_app import rabbitmq_url

    with Connection(rabbitmq_url(), connect_timeout=2) as connection:
        channel = connection.channel()
        try:
            channel.queue_delete(queue)
            channel.exchange_delete(queue)
        finally:
            channel.close()


def _delete_redis_queue(queue: str) -> None:
    """Delete what kombu keeps in Redis for ``queue``: the list, its bindings, and the
    messages a killed worker had taken but not acknowledged (kept as ``[message,
    exchange, routing key]`` in the transport's shared ``unacked`` hash)."""
    import redis

    connection = redis.Redis.from_url(redis_url(), socket_connect_timeout=2, socket_timeout=5)
    try:
        connection.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        for tag, payload in connection.hscan_iter("unacked"):
            with contextlib.suppress(ValueError, IndexError, TypeError):
                if json.loads(payload)[2] == queue:
                    connection.hdel("unacked", tag)
                    connection.zrem("unacked_index", tag)
    finally:
        connection.close()


async def start_worker(procs: Processes, setup: str, queue: str, broker: str = "redis"
                       ) -> Child:
    """Start a Celery worker for ``queue``, taking its tasks from ``broker``, in a process
    group of its own."""
    from bench.celery_app import BROKER_ENV

    pool, concurrency, _ = setup_label(setup)
    command = [PYTHON, "-m", "celery", "-A", "bench.celery_app", "worker", "--pool", pool,
               "--queues", queue, "--hostname", f"{queue}@%h", "--without-gossip",
               "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]
    if concurrency is not None:
        command += ["--concurrency", concurrency]
    return await procs.start(f"celery-{pool}", *command,
                             env={**os.environ, BROKER_ENV: broker}, group=True)


def celery_version() -> str:
    """The installed Celery's version."""
    import celery

    return str(celery.__version__)
