"""The watcher's configuration: one frozen object, validated once."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from watcher.errors import ConfigError
from watcher.pipelines import ServedPipelines
from watcher.rules.checks import check_rate, check_seconds, check_whole_number
from watcher.rules.delays import MAX_SNOOZE_SECONDS

DEFAULT_CONCURRENCY = 32
DEFAULT_POLL_INTERVAL = 1.0
# A crashed processor's partitions wait out the rest of its lease (then one poll)
# before another takes them over, so the lease bounds recovery. Renewal is one
# statement per tick for all of a processor's leases, so a short lease is cheap.
DEFAULT_LEASE_DURATION = 10.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_RETRY_BACKOFF = 1.0
DEFAULT_RETRY_BACKOFF_MAX = 300.0
# Retries one item may take in a row without spending an attempt, for calls its
# handler's service did not answer or answered with Retry-After (watcher.dispatch.unpaid).
DEFAULT_MAX_UNPAID_RETRIES = 10
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
# Seconds one database round trip may take, unless configured (--db-timeout).
DEFAULT_DB_TIMEOUT = 10.0
DEFAULT_LEASE_BATCH = 16
DEFAULT_STEAL_BATCH = 2
# Partitions one watcher leases at most: its memory and lease renewals stay bounded
# however many partitions are open; the rest wait for another watcher or a free spot.
DEFAULT_MAX_LEASES = 1000
DEFAULT_RESULT_BATCH = 256
# Answers parsed and queued for the writer, not yet written, at most (items, and bytes
# of their data): within these, a call's slot is free as soon as its answer is queued.
# 0: each slot is held until its result is written.
DEFAULT_RESULT_BUFFER = 1024
DEFAULT_RESULT_BUFFER_BYTES = 16 * 1024 * 1024
# While results keep coming, the writer waits this long after one write before the
# next, so each carries what arrived meanwhile (a result after a quiet spell goes
# at once).
DEFAULT_RESULT_LINGER = 0.002
MAX_RESULT_LINGER = 1.0
# A reduce gate of up to this many items is reduced in one call; a larger one in
# pages of this many (a fold pass, then an apply pass).
DEFAULT_REDUCE_PAGE_ITEMS = 1000
# A reduce page also stops before its request, as encoded (item data as base64,
# the accumulator, ids and errors), passes this size: the handler SDK's body limit
# (handlers.asgi.DEFAULT_MAX_BODY_BYTES), so the SDK takes every page the
# processor builds.
DEFAULT_REDUCE_PAGE_BYTES = 16 * 1024 * 1024
# The largest item data (inserted by a client, or answered by a handler). It fits
# every supported database at its default settings: MariaDB's 16 MiB packet
# carries 8 MiB of any bytes, which travel as base64 (watcher.store.drivers.mysql.packet).
DEFAULT_MAX_ITEM_BYTES = 8 * 1024 * 1024
# How many items one answer may spawn (a larger fan-out pages: see watcher.rules.spawn).
DEFAULT_MAX_SPAWN = 1000
DEFAULT_MAX_SNOOZE = MAX_SNOOZE_SECONDS
MIN_LEASE_DURATION = 1.0


def default_owner_id() -> str:
    """``<hostname>-<pid>-<random>``: unique per process, readable in ``status``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class WatcherConfig:
    """How one watcher leases partitions and dispatches their items.

    Durations are seconds. Raises :class:`ConfigError` at construction when a
    value is out of range; the message names the setting.
    """

    owner_id: str = field(default_factory=default_owner_id)
    concurrency: int = DEFAULT_CONCURRENCY
    poll_interval: float = DEFAULT_POLL_INTERVAL
    lease_duration: float = DEFAULT_LEASE_DURATION
    max_retries: int = DEFAULT_MAX_RETRIES
    retry_backoff: float = DEFAULT_RETRY_BACKOFF
    retry_backoff_max: float = DEFAULT_RETRY_BACKOFF_MAX
    max_unpaid_retries: int = DEFAULT_MAX_UNPAID_RETRIES
    auto_close: bool = True
    manual_checkpoint: bool = False
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    lease_batch: int = DEFAULT_LEASE_BATCH
    steal_batch: int = DEFAULT_STEAL_BATCH
    max_leases: int = DEFAULT_MAX_LEASES
    result_batch: int = DEFAULT_RESULT_BATCH
    result_buffer: int = DEFAULT_RESULT_BUFFER
    result_buffer_bytes: int = DEFAULT_RESULT_BUFFER_BYTES
    result_linger: float = DEFAULT_RESULT_LINGER
    reduce_page_items: int = DEFAULT_REDUCE_PAGE_ITEMS
    reduce_page_bytes: int = DEFAULT_REDUCE_PAGE_BYTES
    max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES
    max_spawn: int = DEFAULT_MAX_SPAWN
    # The longest snooze a handler may ask for (seconds): at most
    # watcher.rules.delays.MAX_SNOOZE_SECONDS, and the retention period when one is set.
    max_snooze: float = DEFAULT_MAX_SNOOZE
    # Calls in flight per concurrency key across the fleet, unless an operator set the
    # key's own limit; None: no default limit.
    max_inflight_per_key: int | None = None
    # Calls per second to the handler across the fleet (None: no limit); processors
    # name the handler by ``handler_name`` (the HTTP handler's URL without secrets), so
    # those calling one handler share its limit and its Retry-After blocks.
    rate_limit: float | None = None
    # Calls per second per concurrency key across the fleet, unless a key has its own.
    rate_limit_per_key: float | None = None
    handler_name: str = "default"
    # What a wait's deadline does to its item when the answer did not say
    # (watcher.waits): "retry" (an error that spends an attempt) or "fail".
    wait_timeout_policy: str = "retry"
    # The pipelines, versions and gates this watcher serves (watcher.pipelines): it
    # leases no other partition. None: every partition, each dispatched the same way.
    pipelines: ServedPipelines | None = None
    # Where the end of a partition that names no notify URL is sent (the service checks
    # it: ``processor run --notify-url``); None: such an end writes no event.
    notify_default: str | None = None

    def __post_init__(self) -> None:
        # Imported here, not at the top: the CLI reads this module's defaults for its --help,
        # which must not load SQLModel (watcher.models) or the decisions built on it.
        from watcher.models import OWNER_MAX_LENGTH

        if not isinstance(self.owner_id, str) or not self.owner_id.strip():
            raise ConfigError("owner id must be a non-empty string")
        if len(self.owner_id) > OWNER_MAX_LENGTH:
            raise ConfigError(f"owner id is longer than {OWNER_MAX_LENGTH} characters")
        check_whole_number("concurrency", self.concurrency)
        check_whole_number("lease batch", self.lease_batch)
        check_whole_number("steal batch", self.steal_batch)
        check_whole_number("max leases", self.max_leases)
        check_whole_number("result batch", self.result_batch)
        check_whole_number("result buffer", self.result_buffer, minimum=0)
        check_whole_number("result buffer bytes", self.result_buffer_bytes, minimum=0)
        check_whole_number("reduce page items", self.reduce_page_items)
        check_whole_number("reduce page bytes", self.reduce_page_bytes)
        check_whole_number("max item bytes", self.max_item_bytes)
        check_whole_number("max spawn", self.max_spawn)
        check_whole_number("max retries", self.max_retries, minimum=0)
        check_whole_number("max unpaid retries", self.max_unpaid_retries, minimum=0)
        check_seconds("poll interval", self.poll_interval)
        check_seconds("lease duration", self.lease_duration)
        check_seconds("max snooze", self.max_snooze)
        if self.max_inflight_per_key is not None:
            check_whole_number("max in-flight per key", self.max_inflight_per_key)
        for name, rate in (("rate limit", self.rate_limit),
                           ("rate limit per key", self.rate_limit_per_key)):
            if rate is not None:
                check_rate(name, rate)
        if not isinstance(self.handler_name, str) or not self.handler_name:
            raise ConfigError("handler name must be a non-empty string")
        if self.wait_timeout_policy not in ("retry", "fail"):
            raise ConfigError("wait timeout policy must be 'retry' or 'fail', got "
                              f"{self.wait_timeout_policy!r}")
        if self.max_snooze > MAX_SNOOZE_SECONDS:
            raise ConfigError(f"max snooze must be at most {MAX_SNOOZE_SECONDS:g} s, got "
                              f"{self.max_snooze!r}")
        check_seconds("retry backoff", self.retry_backoff)
        check_seconds("retry backoff max", self.retry_backoff_max)
        check_seconds("shutdown timeout", self.shutdown_timeout, allow_zero=True)
        check_seconds("result linger", self.result_linger, allow_zero=True,
                      maximum=MAX_RESULT_LINGER)
        if self.retry_backoff_max < self.retry_backoff:
            raise ConfigError(
                f"retry backoff max ({self.retry_backoff_max}) must be at least the retry "
                f"backoff ({self.retry_backoff})")
        if self.lease_duration < MIN_LEASE_DURATION:
            raise ConfigError(
                f"lease duration must be at least {MIN_LEASE_DURATION} s, got "
                f"{self.lease_duration!r}")
        if self.poll_interval >= self.lease_duration / 3:
            raise ConfigError(
                f"poll interval ({self.poll_interval} s) must be shorter than a third of the "
                f"lease duration ({self.lease_duration} s) so leases are renewed in time")

    @property
    def renew_interval(self) -> float:
        """How often leases are renewed: a third of the lease duration."""
        return self.lease_duration / 3

    @property
    def timeline_write_after(self) -> float:
        """How old a lease's first item done is before a renewal carries the items done
        into the partition's timeline: half a lease, so with renewals every third of a
        lease the timeline row is written every other renewal or so, not at each.
        Nothing is lost meanwhile: gate moves, closes and releases write every count."""
        return self.lease_duration / 2
