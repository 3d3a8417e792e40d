"""Every exception class the docs name can be imported where a reader looks for it:
statefeed's own from ``processor`` (the handler SDK's from ``handlers``, the test kit's from
``processor.testing``). The TypeScript SDK's page names that SDK's errors, which its own
tests hold (sdk/typescript)."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

import handlers
import processor
import processor.testing

DOCS = Path(__file__).resolve().parents[2] / "docs"
# A name written after a dot belongs to another library (``httpx.ReadError``), so it is left out.
NAMED = re.compile(r"(?<!\.)\b([A-Z][A-Za-z]+Error)\b")
# Pages of another language's SDK, whose errors are that language's.
OTHER_LANGUAGES = frozenset({"typescript-sdk.md"})


def documented_errors() -> set[str]:
    """The ``...Error`` names in docs/, less Python's built-in ones."""
    names = {name for page in DOCS.rglob("*.md") if page.name not in OTHER_LANGUAGES
             for name in NAMED.findall(page.read_text())}
    return {name for name in names if not hasattr(builtins, name)}


def test_every_documented_error_is_importable() -> None:
    named = documented_errors()
    assert {"KeyNotFoundError", "PartitionNotFoundError", "ItemDataError"} <= named
    homes = (processor, handlers, processor.testing)  # the test kit's errors are its own
    for name in sorted(named):
        home = next((module for module in homes if name in module.__all__), None)
        assert home is not None, f"{name} is in the docs but not exported"
        error = getattr(home, name)
        assert isinstance(error, type) and issubclass(error, Exception), name


def test_key_not_found_is_statefeeds_error() -> None:
    from processor import InvalidInputError, KeyNotFoundError, StatefeedError

    assert issubclass(KeyNotFoundError, InvalidInputError)
    assert issubclass(KeyNotFoundError, StatefeedError)
