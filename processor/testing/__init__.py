"""A test kit for handlers: a handler app run against a real engine, in process, on a
throwaway SQLite database whose clock the test holds.

    async with HandlerKit(app) as kit:
        await kit.create("doc-1", {"a": "the quick brown fox"}, reduce_gates=[1])
        info = await kit.run_until_done("doc-1")

:mod:`processor.testing.plugin` is its pytest plugin (the ``statefeed`` fixture), which
pytest loads by the package's ``pytest11`` entry point. This folder sits on top of the
service: it may import the client, the HTTP processor, the shared top-level modules and
the engine; nothing in the service imports it. Its names load on first use, so that
loading the plugin costs pytest nothing until a test asks for a kit.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from processor.testing.kit import (
        HandlerKit,
        History,
        KitError,
        NotIdempotentError,
        handler_kit,
    )

_LAZY = {name: "processor.testing.kit" for name in (
    "HandlerKit", "History", "KitError", "NotIdempotentError", "handler_kit")}


def __getattr__(name: str) -> Any:
    """Load a public name on first use.

    Raises:
        AttributeError: ``name`` is not a public name of the package.
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["HandlerKit", "History", "KitError", "NotIdempotentError", "handler_kit"]
