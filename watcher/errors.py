"""The statefeed exception tree.

Every error a user can meet derives from :class:`StatefeedError`. Errors raised
by a processor (the user's handler) are kept apart from infrastructure errors:
they live in :mod:`watcher.protocol` and never escape the engine.
"""

from __future__ import annotations

from collections.abc import Sequence


class StatefeedError(Exception):
    """Base class of every statefeed error."""


class ConfigError(StatefeedError, ValueError):
    """A configuration value is invalid; the message names the setting and the fix."""


class InvalidInputError(StatefeedError, ValueError):
    """Input to the client library is invalid; nothing was written."""


class PartitionExistsError(InvalidInputError):
    """A partition with this id already exists."""

    def __init__(self, partition_id: str) -> None:
        super().__init__(
            f"partition {partition_id!r} already exists; use add_items() to add items to it"
        )
        self.partition_id = partition_id


class PartitionNotFoundError(InvalidInputError, LookupError):
    """No partition has this id."""

    def __init__(self, partition_id: str) -> None:
        super().__init__(
            f"partition {partition_id!r} does not exist; create it with create_partition()"
        )
        self.partition_id = partition_id


class ItemNotFoundError(InvalidInputError, LookupError):
    """The partition exists, but holds no item with this id."""

    def __init__(self, partition_id: str, item_id: str) -> None:
        super().__init__(
            f"partition {partition_id!r} has no item {item_id!r}; list its items with "
            "items(), or find the partitions holding an item id with find_items()"
        )
        self.partition_id = partition_id
        self.item_id = item_id


class KeyNotFoundError(InvalidInputError, LookupError):
    """No partition has had this concurrency key, and none was defined."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"no partition has had key {key!r}, so it is unknown (a typo?); list the keys "
            "with flow_controls(), or pass define=True to set it up before its first "
            "partition")
        self.key = key


def pad_space_rule(ids: Sequence[str]) -> str:
    """The collation rule that makes ``ids`` collide, for an error's end: ``""`` unless
    one of them ends in a space (trailing spaces are what a PAD SPACE collation ignores:
    MariaDB's and MySQL's, and SQL Server's, compare ``'t'`` and ``'t '`` as one id)."""
    if not any(item_id.endswith(" ") for item_id in ids):
        return ""
    return (". The database ignores trailing spaces when it compares ids (its PAD SPACE "
            "collation, as MariaDB, MySQL and SQL Server have), so ids that differ only in "
            "trailing spaces are one id there: strip them, or end ids with another character")


class DuplicateItemError(InvalidInputError):
    """Item ids repeat, within one call or against items already stored."""

    def __init__(self, partition_id: str, item_ids: list[str], *, stored: bool) -> None:
        shown = ", ".join(repr(i) for i in item_ids[:10])
        more = f" and {len(item_ids) - 10} more" if len(item_ids) > 10 else ""
        where = "already exist in" if stored else "appear more than once for"
        super().__init__(
            f"item ids {shown}{more} {where} partition {partition_id!r}; item ids must be unique "
            f"within a partition{pad_space_rule(item_ids)}"
        )
        self.partition_id = partition_id
        self.item_ids = item_ids
        self.stored = stored


class GateError(InvalidInputError):
    """A gate is below the partition's current gate, or otherwise invalid."""


class PartitionChangedError(InvalidInputError):
    """An operator verb named the partition version it expected, and the partition is at
    another one now (someone wrote it meanwhile); or, with ``expected`` ``None``, the
    verb named none and the partition changed between its read and its write. Nothing
    was written."""

    def __init__(self, partition_id: str, expected: int | None, version: int) -> None:
        if expected is None:
            message = (f"partition {partition_id!r} changed while it was being written "
                       f"(another write moved it on from version {version}); nothing was "
                       "written: repeat the command")
        else:
            message = (f"partition {partition_id!r} changed: it is at version {version}, "
                       f"not {expected} as expected; nothing was written (look at it again "
                       "and repeat with its version now)")
        super().__init__(message)
        self.partition_id = partition_id
        self.expected = expected
        self.version = version


class ItemChangedError(InvalidInputError):
    """An operator's write to one item was refused: the item is no longer at the version
    it was read at (a processor, a completion or another operator moved it since).
    Nothing was written."""

    def __init__(self, partition_id: str, item_id: str, expected: int, version: int) -> None:
        super().__init__(
            f"item {item_id!r} of partition {partition_id!r} moved since it was read (it is "
            f"at version {version}, not {expected}); nothing was written: look at it again "
            "and repeat")
        self.partition_id = partition_id
        self.item_id = item_id
        self.expected = expected
        self.version = version


class AnswerRefusedError(InvalidInputError):
    """An operator's answer for one item was refused before anything was written: its
    partition or the item is in a state no answer applies to (the message says which,
    and what to do)."""


class PartitionLeasedError(InvalidInputError):
    """A delete was refused: a processor holds a live lease on the partition."""

    def __init__(self, partition_id: str, owner: str) -> None:
        super().__init__(
            f"partition {partition_id!r} is being processed (processor {owner!r} holds its "
            "lease); cancel it first, or delete it with force=True (processor delete --force), "
            "which cancels it")
        self.partition_id = partition_id
        self.owner = owner


class DatabaseError(StatefeedError):
    """The database could not be reached or refused a statement.

    The message never contains the database password.
    """


class ConnectionLostError(DatabaseError):
    """The connection to the database was lost during the call (the database ended the
    session, restarted, or the network dropped it). Its transaction was rolled back and
    the connection discarded, so the next call opens a fresh one: retry the call. Only
    a loss during the commit itself leaves it unknown whether the write landed; a
    retried write then finds it done (a create or an item id already there is refused
    as a duplicate, and a pause, resume, cancel or retry does nothing twice).
    """


class ValueRefusedError(StatefeedError, ValueError):
    """The database refuses a value of a write: it would fail the same way every
    time, unlike an outage. The message names the value's size, the limit and the fix.

    A write that raises it wrote nothing.
    """


class ScheduleExistsError(InvalidInputError):
    """A schedule with this name already exists."""

    def __init__(self, name: str) -> None:
        super().__init__(f"schedule {name!r} already exists; delete it first, or choose "
                         "another name")
        self.name = name


class ScheduleNotFoundError(InvalidInputError, LookupError):
    """No schedule has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"schedule {name!r} does not exist; list the schedules with "
                         "`processor schedules list`")
        self.name = name


class WaitNotFoundError(InvalidInputError, LookupError):
    """No wait has this completion token (unknown or malformed). Says nothing else."""

    def __init__(self) -> None:
        super().__init__("no wait has this completion token")


class AlreadyCompletedError(InvalidInputError):
    """The wait this token names is over: completed, timed out, cancelled, retried,
    replaced by a newer wait, or its item deleted. Nothing was written. ``status`` is
    the item's status now (``None``: the item is gone); ``deleted`` says the item was
    deleted (its token kept in ``removed_waits``)."""

    def __init__(self, status: str | None = None, *, deleted: bool = False) -> None:
        self.status = status
        self.deleted = deleted
        now = f"; the item is {status} now" if status else ""
        if deleted:
            now = "; the item was deleted"
        super().__init__(
            "this completion token was used already or its wait is over (completed, "
            f"timed out, cancelled or retried); nothing was written{now}")


class CompletionRefusedError(InvalidInputError):
    """A completion's answer cannot be applied; ``field`` names the part at fault.
    Nothing was written and the token stays usable."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class PartitionFinishedError(InvalidInputError):
    """An operator verb was refused: the partition is complete (or being deleted), so
    nothing of it runs again."""

    def __init__(self, partition_id: str, status: str, doing: str) -> None:
        super().__init__(
            f"partition {partition_id!r} is {status}: nothing of it runs again, so it "
            f"cannot {doing}; nothing was written")
        self.partition_id = partition_id
        self.status = status
