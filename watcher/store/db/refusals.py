"""Telling a value the database refuses from an outage, for every write the engine makes.

A refused value fails the same way every time: retrying it wedges whatever
waits on it (an item's result, a reduce page, a partition result, a spawn).
An outage ends: retrying is the remedy. Each driver names its database's
refusals (:meth:`~watcher.store.drivers.base.Driver.refuses_value`); MariaDB and
MySQL may instead drop the connection on a statement they will not take,
which :func:`write_or_refuse` tells from an outage by asking the database a
trivial question at once. Item results, reduce pages and reduce results go
through here; spawns are to as well.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from watcher.errors import ValueRefusedError

if TYPE_CHECKING:
    from watcher.store import Store

T = TypeVar("T")

# How many times one write may drop the connection, while the database answers
# other statements at once, before it is taken for a value the server will not take.
MAX_CONNECTION_DROPS = 3


class UnwritableValueError(ValueRefusedError):
    """The database dropped the connection on one write again and again while it
    answered other statements: the write holds a value the server will not take."""


def is_refusal(store: Store, error: BaseException) -> bool:
    """Whether ``error`` (raised by a write) says the database refuses a value of it."""
    return store.driver.refuses_value(error)


async def database_answers(store: Store) -> bool:
    """Whether the database answers a trivial query now."""
    try:
        await store.ping()
    except Exception:
        return False
    return True


async def blames_a_value(store: Store, error: BaseException) -> bool:
    """Whether a failed write may be to blame for its failure: the database refused a
    value, or dropped the connection on it yet answers at once."""
    if is_refusal(store, error):
        return True
    return store.driver.lost_connection(error) and await database_answers(store)


async def write_or_refuse(store: Store, write: Callable[[], Awaitable[T]]) -> T:
    """Run ``write`` (one transaction); returns what it returns.

    A write on which the connection drops while the database answers other
    statements is tried :data:`MAX_CONNECTION_DROPS` times, then taken for a
    value the server will not take.

    Raises:
        UnwritableValueError: the write kept dropping the connection.
        Exception: what the write raised otherwise: a refusal (:func:`is_refusal`
            says so; retrying it cannot help) or an outage (retry later).
    """
    drops = 0
    while True:
        try:
            return await write()
        except Exception as error:
            if not (store.driver.lost_connection(error) and await database_answers(store)):
                raise
            drops += 1
            if drops == MAX_CONNECTION_DROPS:
                raise UnwritableValueError(
                    f"the database dropped the connection on this write {drops} times "
                    "while it answered other statements: a value is likely larger than "
                    "the server takes (MariaDB and MySQL: max_allowed_packet)"
                ) from None
