"""MariaDB/MySQL's packet accounting (pure): sizes as pymysql's text protocol sends them."""

from __future__ import annotations

import base64

import pytest
from pymysql.converters import escape_item

from watcher.errors import ValueRefusedError
from watcher.store.drivers.mysql.packet import (
    PACKET_MARGIN,
    Base64Blob,
    check_packet,
    value_size,
)

VALUES = ["", "plain", "quote ' and \" and \\ and \x00 \n \r \x1a", "é😀" * 50,
          "x" * 100, b"", b"\x00\\'\"\n\r\x1a" * 20, bytes(range(256)) * 3]


@pytest.mark.parametrize("value", VALUES)
def test_value_size_is_what_pymysql_sends(value: str | bytes) -> None:
    sent = escape_item(value, "utf8mb4")
    sent_bytes = sent.encode("utf-8", "surrogateescape") if isinstance(sent, str) else sent
    assert value_size(value) == len(sent_bytes)


def test_data_goes_as_base64_whatever_its_bytes() -> None:
    convert = Base64Blob().bind_processor(None)  # type: ignore[arg-type]
    worst = b"\x00" * 3000
    sent = convert(worst)
    assert base64.b64decode(sent) == worst
    assert value_size(sent) == 4000 + 2  # not the 6000 + 2 the escaped bytes would take


def test_a_statement_over_the_packet_is_refused_with_the_setting_named() -> None:
    sql = "UPDATE t SET data = FROM_BASE64(%s)"
    fits = "A" * (10_000 - PACKET_MARGIN - len(sql) - 2)
    check_packet(sql, (fits,), 10_000)
    check_packet(sql, (fits + "A",), None)  # the limit not known yet: nothing refused
    with pytest.raises(ValueRefusedError, match="max_allowed_packet of 10000 bytes"):
        check_packet(sql, (fits + "A",), 10_000)
    with pytest.raises(ValueRefusedError):
        check_packet(sql, {"data": "\\" * 5000}, 10_000)  # escaping doubles it
