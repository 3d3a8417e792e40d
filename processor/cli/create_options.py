"""The options a create takes (`processor create`, `processor schedules add`): reduce
gates, failure policy, quorums and start time, parsed from the command line with one
clear line for a bad value. The client's checks (:mod:`processor.client.checks`) come
after these.
"""

from __future__ import annotations

from datetime import datetime

from processor.cli.common import fail


def parse_gates(raw: str) -> list[int]:
    """The gates of ``--reduce-gates 1,3`` (spaces around each allowed), unchecked
    (:func:`processor.client.checks.parse_gate_list`, which the console's form uses)."""
    from processor.client.checks import parse_gate_list
    from watcher.errors import InvalidInputError

    try:
        return parse_gate_list(raw, "--reduce-gates")
    except InvalidInputError as error:
        raise fail(str(error)) from None


def parse_quorum(raw: list[str]) -> dict[int, int] | None:
    """The ``--quorum GATE=K`` options as ``{gate: k}`` (checked further by
    :func:`~processor.client.checks.check_quorum`); ``None`` when none is given.

    Raises:
        typer.Exit: an option that is not two whole numbers joined by ``=``, or a gate
            given twice.
    """
    from processor.client.checks import MAX_GATE_DIGITS

    quorum: dict[int, int] = {}
    for option in raw:
        gate, equals, k = (part.strip() for part in option.partition("="))
        if not (equals and all(part.isascii() and part.isdigit()
                               and len(part) <= MAX_GATE_DIGITS for part in (gate, k))):
            raise fail(f"--quorum must be GATE=K with whole numbers, such as 1=2 (gate 1 "
                       f"passes once 2 of its items are complete); got {option!r}")
        if int(gate) in quorum:
            raise fail(f"--quorum names gate {int(gate)} twice; give each gate once")
        quorum[int(gate)] = int(k)
    return quorum or None


def parse_start_at(raw: str) -> datetime | None:
    """``--start-at`` as an aware time; ``None`` when not given.

    Raises:
        typer.Exit: not an RFC 3339 time with an offset, or more than a year ahead.
    """
    from watcher.rules.delays import DelayError, parse_time

    if not raw:
        return None
    try:
        return parse_time(raw, "--start-at")
    except DelayError as error:
        raise fail(str(error)) from None


def parse_policy(raw: str) -> str:
    """``--on-item-failure`` checked.

    Raises:
        typer.Exit: not one of the policies.
    """
    from processor.client.checks import ITEM_FAILURE_POLICIES

    if raw not in ITEM_FAILURE_POLICIES:
        raise fail(f"--on-item-failure must be one of {', '.join(ITEM_FAILURE_POLICIES)}, "
                   f"got {raw!r}")
    return raw
