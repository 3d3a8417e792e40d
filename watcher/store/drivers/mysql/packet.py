"""MariaDB/MySQL's packet limit: the size of a statement on the wire, checked before it goes.

The server drops the connection on a statement larger than its
``max_allowed_packet`` (16 MiB by default on MariaDB), and the client reports
that as a lost connection, which looks like an outage. Each connection reads
the server's limit when it opens; a statement that would not fit is refused
here, before it is sent, with :class:`~watcher.errors.ValueRefusedError`
naming the sizes and the fix.

Item data travels as base64 (``FROM_BASE64``, see :class:`Base64Blob`):
the text protocol escapes a zero byte, a backslash or a quote into two
bytes, so 8 MiB of such bytes would need 16 MiB on the wire; base64 needs
4/3 of the bytes whatever they are.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func
from sqlalchemy.dialects import mysql
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator

from watcher.errors import ValueRefusedError

# The bytes the text protocol escapes (pymysql's escape table): each takes two.
_ESCAPED = ("\x00", "\\", "\n", "\r", "\x1a", "'", '"')
_ESCAPED_BYTES = tuple(character.encode() for character in _ESCAPED)
# Room for the packet's header and what a value's size does not count.
PACKET_MARGIN = 1024
# What the server is asked for on each new connection.
READ_PACKET_LIMIT = "SELECT @@max_allowed_packet"
# Where a connection keeps its server's limit (SQLAlchemy's per-connection ``info``).
PACKET_KEY = "statefeed_max_allowed_packet"


class Base64Blob(TypeDecorator[bytes]):
    """``LONGBLOB`` whose values are sent as base64 text and stored by ``FROM_BASE64``,
    so that a value takes 4/3 of its size on the wire, whatever its bytes."""

    impl = mysql.LONGBLOB
    cache_ok = True

    def bind_expression(self, bindvalue: Any) -> ColumnElement[Any]:
        return func.from_base64(bindvalue)

    def bind_processor(self, dialect: Any) -> Any:
        # Replaces the blob's own processor, which would make the text bytes again.
        return _to_base64


def base64_text(data: bytes | bytearray | memoryview) -> str:
    """``data`` as base64 text, which ``FROM_BASE64`` turns back into bytes."""
    return base64.b64encode(data).decode("ascii")


def _to_base64(value: Any) -> Any:
    return base64_text(value) if isinstance(value, bytes | bytearray | memoryview) else value


def value_size(value: Any) -> int:
    """The bytes ``value`` takes in a statement sent by pymysql's text protocol."""
    if isinstance(value, str):
        size = len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
        return size + sum(value.count(character) for character in _ESCAPED) + 2
    if isinstance(value, bytes | bytearray):
        return len(value) + sum(value.count(character) for character in _ESCAPED_BYTES) + 2
    if isinstance(value, Sequence):  # a tuple for IN (...)
        return sum(value_size(element) + 1 for element in value) + 2
    return 32


def statement_size(sql: str, params: Any) -> int:
    """The bytes of ``sql`` with ``params`` (one set: a mapping or a sequence) on the wire."""
    values = params.values() if isinstance(params, Mapping) else (params or ())
    return len(sql) + sum(value_size(value) for value in values)


def check_packet(sql: str, params: Any, limit: int | None) -> None:
    """Refuse a statement the server's packet (``limit`` bytes; ``None``: not known)
    cannot carry.

    Raises:
        ValueRefusedError: the statement would be larger than ``limit``; nothing
            was sent.
    """
    if limit is None:
        return
    values = params.values() if isinstance(params, Mapping) else (params or ())
    # A bound no escaping or encoding can pass, so that the common small statement
    # is not scanned.
    rough = len(sql) + sum(8 * len(value) if isinstance(value, str | bytes | bytearray)
                           else 64 for value in values)
    if rough + PACKET_MARGIN <= limit:
        return
    size = statement_size(sql, params)
    if size + PACKET_MARGIN <= limit:
        return
    largest = max((value_size(value) for value in values), default=0)
    raise ValueRefusedError(
        f"a value of this write takes {largest} bytes on the wire, and the statement "
        f"{size} bytes: over the server's max_allowed_packet of {limit} bytes, so the "
        "database would drop the connection on it; raise max_allowed_packet "
        "(max_allowed_packet = 64M under [mysqld]) or lower the processor's "
        "--max-item-bytes")


def check_many(sql: str, params: Any, limit: int | None) -> None:
    """:func:`check_packet` for each parameter set of an ``execute`` or ``executemany``.

    Raises:
        ValueRefusedError: as :func:`check_packet`.
    """
    if limit is None:
        return
    if isinstance(params, list):
        for one in params:
            check_packet(sql, one, limit)
    else:
        check_packet(sql, params, limit)
