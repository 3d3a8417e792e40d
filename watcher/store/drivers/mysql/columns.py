"""MariaDB's and MySQL's column types and table options, as the models and migrations use them.

- Ids compare exactly: ``utf8mb4_bin``, where the default collation ignores case
  (``Resume-1`` and ``resume-1`` would collide).
- Times keep microseconds: DATETIME keeps no fraction unless asked (``fsp=6``).
- Item bytes: LONGBLOB (BLOB stops at 64 KiB), sent as base64 so that any bytes
  take 4/3 of their size in a statement (:mod:`.packet`).
- Tables are InnoDB with a four-byte UTF-8 character set, whatever the server's
  default is.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeEngine

from watcher.store.drivers.mysql.packet import Base64Blob

DIALECTS = ("mysql", "mariadb")
# (The mariadb dialect reads only the mariadb_ spellings, the mysql one only mysql_.)
TABLE_OPTIONS: dict[str, Any] = {
    f"{name}_{option}": value
    for name in DIALECTS
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"))
}


def key_type(length: int) -> TypeEngine[str]:
    """An id column, compared byte for byte."""
    return mysql.VARCHAR(length, collation="utf8mb4_bin")


def timestamp_type() -> TypeEngine[Any]:
    """A time with six fractional digits."""
    return mysql.DATETIME(fsp=6)


def data_type() -> TypeEngine[bytes]:
    """Item bytes: LONGBLOB, sent as base64."""
    return Base64Blob()
