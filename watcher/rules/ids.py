"""The rules every partition and item id follows, wherever it comes from: the client,
a step's spawn, or a reduce's. Pure: no I/O."""

from __future__ import annotations

import re

from watcher.models import ID_MAX_LENGTH, PIPELINE_MAX_LENGTH

_SHOWN = 40


def id_problem(kind: str, value: object) -> str | None:
    """Why ``value`` cannot be a ``kind`` id (``"item"``, ``"partition"``), or ``None``.

    An id is non-empty text of at most :data:`~watcher.models.ID_MAX_LENGTH`
    characters, without NUL (PostgreSQL refuses it in text) and without an
    unpaired UTF-16 surrogate (no database stores one: it is not UTF-8). One
    rule on every database.
    """
    if not isinstance(value, str) or not value:
        return f"{kind} id must be a non-empty string, got {value!r}"
    if len(value) > ID_MAX_LENGTH:
        return (f"{kind} id {value[:_SHOWN]!r}... is {len(value)} characters; the limit is "
                f"{ID_MAX_LENGTH}")
    if "\x00" in value:
        return (f"{kind} id {value[:_SHOWN]!r} contains a NUL character; ids must be text "
                "without NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return (f"{kind} id {value[:_SHOWN]!r} contains an unpaired surrogate; ids must be "
                "valid Unicode text")
    return None


# A pipeline's name or version: a word an operator types and a routes file names.
_PIPELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def pipeline_name_problem(field: str, value: object) -> str | None:
    """Why ``value`` cannot be a ``field`` (``"pipeline"``, ``"pipeline_version"``), or
    ``None``: a name is 1 to :data:`~watcher.models.PIPELINE_MAX_LENGTH` ASCII letters,
    digits, ``_``, ``.`` and ``-``, starting with a letter or digit."""
    if not isinstance(value, str) or not value:
        return f"{field} must be a non-empty string such as 'invoices', got {value!r}"
    if len(value) > PIPELINE_MAX_LENGTH:
        return (f"{field} {value[:_SHOWN]!r}... is {len(value)} characters; the limit is "
                f"{PIPELINE_MAX_LENGTH}")
    if not _PIPELINE_NAME.fullmatch(value):
        return (f"{field} {value[:_SHOWN]!r} must be ASCII letters, digits, '_', '.' and "
                "'-', starting with a letter or digit (such as 'invoices' or 'v2')")
    return None
