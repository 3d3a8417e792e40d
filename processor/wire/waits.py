"""The ``wait`` of an answer on the wire: ``{"timeout": seconds, "on_timeout"?: "retry" |
"fail"}`` (:mod:`watcher.waits`). A handler's answer and a completion carry it alike."""

from __future__ import annotations

from typing import Any

from processor.wire.values import MalformedResponseError, show_value
from watcher.waits import TIMEOUT_POLICIES, Wait, timeout_problem

WAIT_FIELDS = frozenset({"timeout", "on_timeout"})


def parse_wait(value: Any) -> Wait:
    """An answer's ``wait`` object as a :class:`~watcher.waits.Wait`.

    Raises:
        MalformedResponseError: not an object, an unknown key, a timeout that is not a
            number of seconds above 0 and at most 30 days, or an unknown policy.
    """
    if not isinstance(value, dict):
        raise MalformedResponseError(
            f"'wait' must be an object such as {{\"timeout\": 3600}}, got {show_value(value)}")
    unknown = sorted(set(value) - WAIT_FIELDS)
    if unknown:
        raise MalformedResponseError(
            f"'wait' has the unknown key {show_value(unknown[0])}; it takes 'timeout' and "
            "'on_timeout'")
    timeout = value.get("timeout")
    problem = timeout_problem(timeout)
    if problem is not None:
        raise MalformedResponseError(problem)
    on_timeout = value.get("on_timeout")
    if on_timeout is not None and on_timeout not in TIMEOUT_POLICIES:
        raise MalformedResponseError(
            f"'wait.on_timeout' must be one of {', '.join(TIMEOUT_POLICIES)}, got "
            f"{show_value(on_timeout)}")
    assert isinstance(timeout, int | float)
    return Wait(float(timeout), on_timeout)
