"""Small pure text helpers shared by the engine, the service and the client.

Messages that reach a user or a log are cut to a readable length here, in one
place, so every module shortens the same way.
"""

from __future__ import annotations

ELLIPSIS = "..."


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with ``...`` appended when it was cut."""
    return text if len(text) <= limit else text[:limit] + ELLIPSIS


def error_text(error: BaseException | None, limit: int = 300) -> str:
    """``"<Type>: <message>"`` (just the type when the message is empty), shortened."""
    if error is None:
        return "unknown error"
    text = str(error).strip()
    return f"{type(error).__name__}: {shorten(text, limit)}" if text else type(error).__name__


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of a database error's text (the driver's own error when wrapped).

    SQLAlchemy errors carry the statement and parameters after the first line,
    which are long and may hold values; the first line says what went wrong.
    Returns the error's type name when it has no text.
    """
    lines = str(getattr(error, "orig", None) or error).strip().splitlines()
    return shorten(lines[0], limit) if lines else type(error).__name__
