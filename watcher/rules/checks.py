"""Validation of configuration numbers, with one wording for every setting.

Each check raises :class:`~watcher.errors.ConfigError` naming the setting, the
range expected and the value given; ``bool`` is never taken for a number.
"""

from __future__ import annotations

import math

from watcher.errors import ConfigError


def check_whole_number(setting: str, value: object, *, minimum: int = 1,
                       maximum: int | None = None) -> int:
    """Return ``value`` if it is an ``int`` from ``minimum`` to ``maximum`` (inclusive).

    Raises:
        ConfigError: ``value`` is not such a whole number.
    """
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (maximum is not None and value > maximum)):
        upper = f" to {maximum}" if maximum is not None else " or more"
        raise ConfigError(f"{setting} must be a whole number from {minimum}{upper}, "
                          f"got {value!r}")
    return value


def check_seconds(setting: str, value: object, *, allow_zero: bool = False,
                  maximum: float | None = None) -> float:
    """Return ``value`` if it is a finite number of seconds above 0 (or 0 when allowed).

    Raises:
        ConfigError: ``value`` is not a number, not finite, negative, 0 when
            that is not allowed, or above ``maximum``.
    """
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)
            or (maximum is not None and value > maximum)):
        lower = "0 or more" if allow_zero else "greater than 0"
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise ConfigError(f"{setting} must be a number of seconds {lower}{upper}, "
                          f"got {value!r}")
    return float(value) if isinstance(value, int) else value


# The fastest rate a fleet-wide limit can hold: processors claim tokens from the
# database a few times a second, so a rate far above what one claim can carry is
# not enforced evenly; and the slowest, a call every 100 seconds.
MAX_RATE = 10_000.0
MIN_RATE = 0.01


def check_rate(setting: str, value: object) -> float:
    """Return ``value`` if it is a rate statefeed can enforce: calls per second from
    :data:`MIN_RATE` to :data:`MAX_RATE`.

    Raises:
        ConfigError: not a number, not finite, or out of that range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{setting} must be calls per second (a number), got {value!r}")
    if not MIN_RATE <= value <= MAX_RATE:
        raise ConfigError(
            f"{setting} must be from {MIN_RATE} to {MAX_RATE:,.0f} calls per second, got "
            f"{value!r}: faster than that a fleet-wide limit cannot be held evenly (leave it "
            "unset), and slower, pause the work instead")
    return float(value)
