"""The one escaping rule for data shown in a log line or a terminal
(processor/observe/safe_text.py): control characters become visible escapes, all else stays."""

from __future__ import annotations

import json

import pytest

from processor.observe.safe_text import escape_controls, json_text

# Every character the rule escapes: C0, DEL, C1, the separators, the bidi controls.
CONTROLS = [*map(chr, range(0x20)), "\x7f", *map(chr, range(0x80, 0xA0)),
            "\u2028", "\u2029", *map(chr, range(0x202A, 0x202F)),
            *map(chr, range(0x2066, 0x206A))]


@pytest.mark.parametrize(("raw", "shown"), [
    ("plain id", "plain id"),
    ("a\nb", "a\\nb"),
    ("a\r\nb", "a\\r\\nb"),
    ("tab\there", "tab\\there"),
    ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear the screen
    ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # OSC: retitle the window
    ("\x9b31m", "\\x9b31m"),  # the 8-bit CSI
    ("\x00\x7f", "\\x00\\x7f"),
    ("p\u2028q\u2029r", "p\\u2028q\\u2029r"),
    ("\u202eevil", "\\u202eevil"),
    ("[bold]x[/] \\x1b é 中 🙂", "[bold]x[/] \\x1b é 中 🙂"),  # not controls: left be
])
def test_controls_are_escaped_visibly_and_nothing_else(raw: str, shown: str) -> None:
    assert escape_controls(raw) == shown


def test_no_control_character_survives_and_the_text_stays_one_line() -> None:
    text = escape_controls("".join(CONTROLS))
    assert not any(char in text for char in CONTROLS)
    assert len(text.splitlines()) == 1
    assert text.isprintable()


@pytest.mark.parametrize("value", [
    {"id": "a\x1b]0;t\x07b", "e": "\x9b2J\x7f", "s": "x\u2028y\u202e"},
    ["plain", "é", 1, None],
])
def test_json_text_stays_json_with_the_same_value_and_no_raw_control(value: object) -> None:
    text = json_text(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value
    assert not any(char in text for char in CONTROLS if char not in "\n")
