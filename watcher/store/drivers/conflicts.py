"""How each database says that a transaction lost a lock conflict and should be retried."""

from __future__ import annotations

# Errors by which a database aborts one transaction to resolve a lock conflict:
# PostgreSQL deadlock / serialization failure (SQLSTATE), MySQL deadlock / lock
# wait timeout and SQL Server deadlock victim (error numbers). Retrying the
# transaction is the remedy.
CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})
CONFLICT_CODES = frozenset({1213, 1205})


def error_number(error: BaseException | None) -> int | None:
    """The error number a driver error carries first in its ``args`` (MariaDB, MySQL and
    SQL Server put it there), or ``None``."""
    args: tuple[object, ...] = getattr(error, "args", ())
    number = args[0] if args else None
    return number if isinstance(number, int) else None


def is_lock_conflict(error: BaseException) -> bool:
    """Whether ``error`` (a SQLAlchemy error) is a deadlock or lock timeout, not an outage."""
    orig = getattr(error, "orig", None)
    if orig is None:
        return False
    if getattr(orig, "sqlstate", None) in CONFLICT_SQLSTATES:
        return True
    return error_number(orig) in CONFLICT_CODES
