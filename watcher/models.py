"""SQLModel tables: ``partitions``, ``items`` and ``leaders``.

These classes define the canonical schema. :mod:`watcher.store.sql.schema` copies them
under a table prefix; the Alembic migrations in ``watcher/migrations`` create
them. A partition is *free* when it is ``available`` and its ``until`` has
passed: unleased partitions carry ``owner = ''`` and an ``until`` in the past,
so one index on ``(status, until, owner)`` serves both "free" and "live" scans.

Column types carry per-database variants, the same ones the migration creates;
each database's are in its package (``watcher/store/drivers/<database>/columns.py``):
ids compare exactly, times keep microseconds, and item data holds more than
the 16 MiB a handler may answer.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    Unicode,
    UnicodeText,
    text,
)
from sqlalchemy.types import TypeEngine
from sqlmodel import Field, SQLModel

from watcher.records import DEFAULT_PIPELINE
from watcher.store.drivers.mssql import columns as mssql_columns
from watcher.store.drivers.mysql import columns as mysql_columns

ID_MAX_LENGTH = 255
OWNER_MAX_LENGTH = 255
STATUS_MAX_LENGTH = 16
# Gates (and versions, attempts) are INTEGER columns: 32-bit signed on every database.
MAX_GATE = 2**31 - 1

# InnoDB with a four-byte UTF-8 default, whatever the server's own default is.
MYSQL_TABLE_OPTIONS = mysql_columns.TABLE_OPTIONS


def key_type(length: int) -> TypeEngine[str]:
    """An id column: compared exactly on every database (MySQL, MariaDB and SQL Server
    get binary collations: their defaults ignore case)."""
    return (Unicode(length)
            .with_variant(mysql_columns.key_type(length), *mysql_columns.DIALECTS)
            .with_variant(mssql_columns.key_type(length), *mssql_columns.DIALECTS))


def timestamp_type() -> TypeEngine[Any]:
    """A naive UTC time with microseconds, as Python's datetime has."""
    return (DateTime()
            .with_variant(mysql_columns.timestamp_type(), *mysql_columns.DIALECTS)
            .with_variant(mssql_columns.timestamp_type(), *mssql_columns.DIALECTS))


def error_type() -> TypeEngine[str]:
    """Error text of any length."""
    return UnicodeText().with_variant(mssql_columns.error_type(), *mssql_columns.DIALECTS)


def data_type() -> TypeEngine[bytes]:
    """Item bytes, more than the 16 MiB a handler may answer."""
    return (LargeBinary()
            .with_variant(mysql_columns.data_type(), *mysql_columns.DIALECTS)
            .with_variant(mssql_columns.data_type(), *mssql_columns.DIALECTS))


class Status(StrEnum):
    """The status of a partition or an item."""

    AVAILABLE = "available"
    COMPLETE = "complete"
    FAILED = "failed"
    # Items only: parked at its gate until someone outside completes it, it times out,
    # or its partition is cancelled (watcher.waits).
    WAITING = "waiting"
    # Items only: left behind at a gate a quorum passed (settled, never called again).
    SKIPPED = "skipped"
    # Partitions only: stopped by a client (nothing dispatches it; retry_failed resumes it).
    CANCELLED = "cancelled"
    # Partitions only: a delete or purge has begun; its items go in batches, the row last.
    DELETING = "deleting"


# The statuses a partition can have (the backlog counts partitions by these).
PARTITION_STATUSES = tuple(status for status in Status
                           if status not in (Status.WAITING, Status.SKIPPED))

# The statuses as the plain strings the tables store (and statements compare with).
AVAILABLE = Status.AVAILABLE.value
COMPLETE = Status.COMPLETE.value
FAILED = Status.FAILED.value
CANCELLED = Status.CANCELLED.value
WAITING = Status.WAITING.value
SKIPPED = Status.SKIPPED.value
DELETING = Status.DELETING.value


class ItemFailurePolicy(StrEnum):
    """What a failed item does to its partition (chosen when the partition is created)."""

    FAIL = "fail"  # the partition fails at the gate where the item failed
    CONTINUE = "continue"  # the partition carries on with the other items


class ReducePass(StrEnum):
    """The pass a paged reduce is in; a one-call reduce stores none."""

    FOLD = "fold"
    APPLY = "apply"


REDUCE_GATES_MAX_LENGTH = 1000
POLICY_MAX_LENGTH = 16
NOTIFY_URL_MAX_LENGTH = 2000
PIPELINE_MAX_LENGTH = 64
REDUCE_PASS_MAX_LENGTH = 8
REQUEST_DIGEST_LENGTH = 64


class Partition(SQLModel, table=True):
    """A top-level job: its current gate, status and lease.

    ``reduce_gates`` (JSON list of gates, or NULL) and ``on_item_failure`` are
    fixed at creation. ``result`` is the partition result a reduce stored. The
    ``reduce_*`` columns hold a paged reduce's progress at the current gate
    (pass, pages done, the last item id done and the accumulator), so a
    failover resumes it; ``reduce_attempts`` and ``last_error`` count and
    explain failed reduce calls.
    """

    __tablename__ = "partitions"
    # Lease scans: status and until (and owner), and the queue order (status, rank_at,
    # then id for partitions at one place: revision 0010).
    # Retention and gauges: status, last update. Paged listings: created_at and id.
    __table_args__ = (Index("ix_partitions_lease", "status", "until", "owner"),
                      Index("ix_partitions_updated", "status", "updated_at"),
                      Index("ix_partitions_created", "created_at", "id"),
                      Index("ix_partitions_rank", "status", "rank_at", "id"),
                      MYSQL_TABLE_OPTIONS)

    id: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), primary_key=True))
    version: int = Field(default=1, sa_column=Column(Integer, nullable=False))
    gate: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    status: str = Field(default=Status.AVAILABLE,
                        sa_column=Column(Unicode(STATUS_MAX_LENGTH), nullable=False))
    owner: str = Field(default="", sa_column=Column(key_type(OWNER_MAX_LENGTH), nullable=False))
    until: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    created_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    updated_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    reduce_gates: str | None = Field(
        default=None, sa_column=Column(Unicode(REDUCE_GATES_MAX_LENGTH), nullable=True))
    on_item_failure: str = Field(
        default=ItemFailurePolicy.FAIL,
        sa_column=Column(Unicode(POLICY_MAX_LENGTH), nullable=False,
                         server_default=ItemFailurePolicy.FAIL.value))
    result: bytes | None = Field(default=None, sa_column=Column(data_type(), nullable=True))
    reduce_pass: str | None = Field(
        default=None, sa_column=Column(Unicode(REDUCE_PASS_MAX_LENGTH), nullable=True))
    reduce_page: int = Field(default=0, sa_column=Column(Integer, nullable=False,
                                                         server_default=text("0")))
    reduce_after: str | None = Field(
        default=None, sa_column=Column(key_type(ID_MAX_LENGTH), nullable=True))
    reduce_acc: bytes | None = Field(default=None, sa_column=Column(data_type(), nullable=True))
    reduce_attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False,
                                                             server_default=text("0")))
    last_error: str | None = Field(default=None, sa_column=Column(error_type(), nullable=True))
    # Items its steps and reduces spawned (revision 0006).
    spawned: int = Field(default=0, sa_column=Column(Integer, nullable=False,
                                                     server_default=text("0")))
    # SHA-256 (hex) of the API request that created it; NULL: the library did (0007).
    request_digest: str | None = Field(
        default=None, sa_column=Column(Unicode(REQUEST_DIGEST_LENGTH), nullable=True))
    # The creator's W3C trace context as JSON; NULL when tracing was off (revision 0008).
    trace_context: str | None = Field(default=None,
                                      sa_column=Column(error_type(), nullable=True))
    # Unwritten since 0013 moved it to ``partition_timelines``; kept for older processors.
    timeline: str | None = Field(default=None, sa_column=Column(error_type(), nullable=True))
    # From -10 to 10, fixed at creation; rank_at is the partition's place in the lease
    # queue (see watcher.rules.priority); paused_at is set while a client has it paused
    # (revision 0009).
    priority: int = Field(default=0, sa_column=Column(Integer, nullable=False,
                                                      server_default=text("0")))
    rank_at: datetime | None = Field(default=None,
                                     sa_column=Column(timestamp_type(), nullable=True))
    paused_at: datetime | None = Field(default=None,
                                       sa_column=Column(timestamp_type(), nullable=True))
    # The concurrency key (a tenant); '' for none (revision 0009).
    flow_key: str = Field(default="", sa_column=Column(key_type(ID_MAX_LENGTH), nullable=False,
                                                       server_default=text("''")))
    # JSON {gate: k}: the gate passes once k of its items are complete (revision 0011).
    quorum: str | None = Field(
        default=None, sa_column=Column(Unicode(REDUCE_GATES_MAX_LENGTH), nullable=True))
    # Where an event is POSTed when the partition ends (http(s); NULL: none; rev. 0015).
    notify: str | None = Field(
        default=None, sa_column=Column(Unicode(NOTIFY_URL_MAX_LENGTH), nullable=True))
    # Its pipeline, and the version it keeps until it closes or is moved (revision 0016).
    pipeline: str = Field(default=DEFAULT_PIPELINE, sa_column=Column(
        key_type(PIPELINE_MAX_LENGTH), nullable=False, server_default=text("'default'")))
    pipeline_version: str | None = Field(
        default=None, sa_column=Column(key_type(PIPELINE_MAX_LENGTH), nullable=True))


# The rows ``ix_items_spawned`` holds where a database can leave the others out.
SPAWNED_ONLY = text("parent IS NOT NULL OR spawned_by_reduce IS NOT NULL")
# The rows ``ix_items_wait`` holds where a database can leave the others out.
WAITED_ONLY = text("wait_key IS NOT NULL")
TOKEN_HASH_LENGTH = 64
TRACEPARENT_MAX_LENGTH = 64  # a W3C traceparent (version 00) is 55 characters


class Item(SQLModel, table=True):
    """One unit of work inside a partition, with its opaque bytes."""

    __tablename__ = "items"
    # Ready reads: one partition's available items at a gate, in (retry_at, id) order.
    __table_args__ = (
        Index("ix_items_ready", "partition_id", "status", "gate", "retry_at", "id"),
        # An item by id across partitions (search, ``processor items --show``).
        Index("ix_items_id", "id", "partition_id"),
        # A partition's spawned items, by their item parent or reduce (rewinds; 0018):
        # only those on PostgreSQL and SQLite, so that the other items' writes and
        # lookups by partition never meet it (MariaDB and SQL Server: every item).
        Index("ix_items_spawned", "partition_id", "parent", "spawned_by_reduce",
              postgresql_where=SPAWNED_ONLY, sqlite_where=SPAWNED_ONLY),
        # An item by its last wait's token key (completions, heartbeats; 0021): only
        # the items that ever parked, where the database can leave the others out.
        Index("ix_items_wait", "wait_key", postgresql_where=WAITED_ONLY,
              sqlite_where=WAITED_ONLY, mssql_where=WAITED_ONLY),
        MYSQL_TABLE_OPTIONS,
    )

    partition_id: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), primary_key=True))
    id: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), primary_key=True))
    version: int = Field(default=1, sa_column=Column(Integer, nullable=False))
    gate: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    status: str = Field(default=Status.AVAILABLE,
                        sa_column=Column(Unicode(STATUS_MAX_LENGTH), nullable=False))
    data: bytes = Field(sa_column=Column(data_type(), nullable=False))
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    last_error: str | None = Field(default=None, sa_column=Column(error_type(), nullable=True))
    retry_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    created_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    updated_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    # The item whose answer spawned this one; NULL for the client's (revision 0006).
    parent: str | None = Field(
        default=None, sa_column=Column(key_type(ID_MAX_LENGTH), nullable=True))
    # The gate of the reduce whose answer spawned it; NULL for the others, and for the
    # items reduces spawned before revision 0018.
    spawned_by_reduce: int | None = Field(default=None,
                                          sa_column=Column(Integer, nullable=True))
    # The last few errors as JSON (time, attempt, gate each); NULL: none (revision 0008).
    error_history: str | None = Field(default=None,
                                      sa_column=Column(error_type(), nullable=True))
    # The item's last wait (revision 0021), kept in its row so that parking is one
    # write: its token's key (still set once the wait is over, so a late completion
    # is told so), its timeout in seconds, its timeout policy ('' for the processor's)
    # and the parking call's traceparent. A new wait moves the key it replaces to
    # ``waits``; NULL: the item never parked.
    wait_key: str | None = Field(
        default=None, sa_column=Column(key_type(TOKEN_HASH_LENGTH), nullable=True))
    wait_timeout: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    wait_policy: str | None = Field(
        default=None, sa_column=Column(Unicode(POLICY_MAX_LENGTH), nullable=True))
    wait_traceparent: str | None = Field(
        default=None, sa_column=Column(key_type(TRACEPARENT_MAX_LENGTH), nullable=True))


class Wait(SQLModel, table=True):
    """A completion token's key that is not an item's last wait (revision 0011),
    with the item it names and the item's version while that wait is on.

    Since revision 0021 an item's current wait lives in its own row
    (:class:`Item`'s ``wait_key`` and the columns beside it); a row here is an
    operator's token for a current wait (at the item's waiting version), or the key
    of a wait that a newer one replaced (version 0, never current). A completion
    applies only while the item is ``waiting`` at that version; every other write of
    the item bumps the version, so a late completion is told the token was used
    already. ``timeout`` (seconds) and ``on_timeout`` (``retry``, ``fail``) say what
    the deadline does. Revision 0014 added ``traceparent`` (the parking call's trace
    context) and ``operator_token`` (an operator's second token, before 0021).
    """

    __tablename__ = "waits"
    __table_args__ = (Index("ix_waits_item", "partition_id", "item_id", "version"),
                      Index("ix_waits_operator", "operator_token"),
                      MYSQL_TABLE_OPTIONS)

    token: str = Field(sa_column=Column(key_type(TOKEN_HASH_LENGTH), primary_key=True))
    partition_id: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), nullable=False))
    item_id: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), nullable=False))
    version: int = Field(sa_column=Column(Integer, nullable=False))
    timeout: float = Field(sa_column=Column(Float, nullable=False))
    on_timeout: str = Field(sa_column=Column(Unicode(POLICY_MAX_LENGTH), nullable=False))
    created_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    traceparent: str | None = Field(
        default=None, sa_column=Column(key_type(TRACEPARENT_MAX_LENGTH), nullable=True))
    operator_token: str | None = Field(
        default=None, sa_column=Column(key_type(TOKEN_HASH_LENGTH), nullable=True))


SCOPE_MAX_LENGTH = 16


class FlowScope(StrEnum):
    """What a flow control row governs."""

    KEY = "key"  # one concurrency key's partitions
    HANDLER = "handler"  # every call to one handler
    FLEET = "fleet"  # everything (name '')


class FlowControl(SQLModel, table=True):
    """The flow controls of a key, a handler or the fleet (revision 0009).

    ``next_start`` is a key's virtual clock for fair queuing (see
    :mod:`watcher.rules.fairness`); ``max_inflight`` and ``rate_limit`` are limits an
    operator set (NULL: the processors' defaults); ``paused_at`` is set while it is
    paused; ``blocked_until`` holds every call back after a handler's
    ``Retry-After``; ``tokens`` and ``refilled_at`` are its rate limit's bucket.
    Times are the database clock's.
    """

    __tablename__ = "flow_controls"
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    scope: str = Field(sa_column=Column(Unicode(SCOPE_MAX_LENGTH), primary_key=True))
    name: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), primary_key=True))
    next_start: datetime | None = Field(default=None,
                                        sa_column=Column(timestamp_type(), nullable=True))
    max_inflight: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    rate_limit: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    paused_at: datetime | None = Field(default=None,
                                       sa_column=Column(timestamp_type(), nullable=True))
    blocked_until: datetime | None = Field(default=None,
                                           sa_column=Column(timestamp_type(), nullable=True))
    tokens: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    refilled_at: datetime | None = Field(default=None,
                                         sa_column=Column(timestamp_type(), nullable=True))
    version: int = Field(default=1, sa_column=Column(Integer, nullable=False))
    updated_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))


class FlowGrant(SQLModel, table=True):
    """In-flight slots one processor holds for a limited key, until ``until`` (the
    database clock); ``wanted`` is how many it could use (revision 0009)."""

    __tablename__ = "flow_grants"
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    scope: str = Field(sa_column=Column(Unicode(SCOPE_MAX_LENGTH), primary_key=True))
    name: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), primary_key=True))
    owner: str = Field(sa_column=Column(key_type(OWNER_MAX_LENGTH), primary_key=True))
    slots: int = Field(sa_column=Column(Integer, nullable=False))
    wanted: int = Field(sa_column=Column(Integer, nullable=False))
    until: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))


class Leader(SQLModel, table=True):
    """A duty that one processor at a time performs (such as ``retention``), and who holds it.

    The holder's lease works as a partition's does: ``owner`` holds it until
    ``until`` by the database clock, every write bumps ``version``, and another
    processor takes it over only once it has expired.
    """

    __tablename__ = "leaders"
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    name: str = Field(sa_column=Column(key_type(ID_MAX_LENGTH), primary_key=True))
    owner: str = Field(default="", sa_column=Column(key_type(OWNER_MAX_LENGTH), nullable=False))
    until: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
    version: int = Field(default=1, sa_column=Column(Integer, nullable=False))
    updated_at: datetime = Field(sa_column=Column(timestamp_type(), nullable=False))
