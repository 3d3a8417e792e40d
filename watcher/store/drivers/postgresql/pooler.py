"""Behind a transaction pooler (PgBouncer's ``pool_mode = transaction``, and the like).

A transaction pooler lends a server session to a client for one transaction only,
so nothing that lives in a session outlasts the transaction that made it:

- a prepared statement (psycopg prepares a statement after a few runs) may be
  missing on the next transaction's session: "prepared statement ... does not
  exist". Behind such a pooler statefeed never prepares (``prepare_threshold=None``).
- ``LISTEN`` registers a session that another client is given next, so
  notifications are lost: watchers poll instead (every ``--poll-interval``), and
  say so once when they start.

Nothing tells a client it talks to a pooler, so the URL says it:
``postgresql://user@pooler:6432/db?pooler=transaction``. The option is statefeed's,
not libpq's: it is taken out of the URL before any connection is made. ``pooler=session``
(a session pooler, where sessions are whole) changes nothing and is accepted for
clarity. Imports nothing beyond SQLAlchemy's URL, so that URL parsing can use it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from watcher.errors import ConfigError

OPTION = "pooler"
TRANSACTION = "transaction"
SESSION = "session"
MODES = (TRANSACTION, SESSION)
# Why watchers poll behind a transaction pooler (their one log line says it).
POLLING_REASON = ("the database URL says pooler=transaction, and a transaction pooler "
                  "loses LISTEN's notifications")


def pooler_mode(url: URL) -> str | None:
    """The pooler ``url`` names (:data:`TRANSACTION` or :data:`SESSION`), or ``None``.

    Raises:
        ConfigError: the option is given more than once or names another mode.
    """
    value = url.query.get(OPTION)
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in MODES:
        raise ConfigError(
            f"the database URL's {OPTION}= option must be one of: {', '.join(MODES)} "
            f"(got {value!r}); say {OPTION}={TRANSACTION} when the URL points at "
            "PgBouncer in transaction mode")
    return value.lower()


def behind_transaction_pooler(url: URL) -> bool:
    """Whether ``url`` says a transaction pooler sits between statefeed and the database.

    Raises:
        ConfigError: as :func:`pooler_mode`.
    """
    return pooler_mode(url) == TRANSACTION


def without_option(url: URL) -> URL:
    """``url`` without statefeed's ``pooler`` option (what libpq is given)."""
    return url.difference_update_query([OPTION]) if OPTION in url.query else url


def psycopg_options(url: URL) -> dict[str, Any]:
    """psycopg's connection options for ``url``'s pooler: never prepare statements
    behind a transaction pooler; nothing otherwise."""
    return {"prepare_threshold": None} if behind_transaction_pooler(url) else {}
