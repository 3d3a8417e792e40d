"""SQL Server's column types, as the models and migrations use them.

- Ids compare exactly: NVARCHAR with a binary collation, where the default
  ignores case (``Resume-1`` and ``resume-1`` would collide).
- Times keep six fractional digits: DATETIME2 keeps 100 ns, which a driver must
  round (pymssql has rounded 23:59:59.9999999 to an invalid hour).
- Error text is NVARCHAR(max): UnicodeText would render the deprecated NTEXT
  when no server is asked for its version, as in offline DDL.
- Item bytes are VARBINARY(max).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import mssql
from sqlalchemy.types import TypeEngine

DIALECTS = ("mssql",)
# The id columns' binary collation; the batch write compares the ids of its JSON rows
# in it too, so that the comparison has one collation and the primary key serves it.
ID_COLLATION = "Latin1_General_100_BIN2"


def key_type(length: int) -> TypeEngine[str]:
    """An id column, compared exactly."""
    return mssql.NVARCHAR(length, collation=ID_COLLATION)


def timestamp_type() -> TypeEngine[Any]:
    """A time with six fractional digits."""
    return mssql.DATETIME2(precision=6)


def error_type() -> TypeEngine[str]:
    """Error text of any length."""
    return mssql.NVARCHAR()


def data_type() -> TypeEngine[bytes]:
    """Item bytes of any length."""
    return mssql.VARBINARY("max")
