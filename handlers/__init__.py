"""statefeed handlers: write the HTTP handler a processor POSTs items to.

A handler is a plain function from :class:`Item` to :class:`Result`, sync or
async; :func:`app` turns it into an ASGI app for uvicorn::

    import handlers

    def extract(item: handlers.Item) -> handlers.Result:
        resume = item.json()                 # bad JSON: a non-retryable 400
        if "text" not in resume:
            raise handlers.Fail("no 'text' field")          # 422, not retried
        return handlers.Result(gate=1, data={"words": len(resume["text"].split())})

    app = handlers.app(extract)              # uvicorn mymodule:app

``app({0: extract, 1: rank})`` routes items by gate; :func:`serve` runs uvicorn.
Raise :class:`Retry` to be called again later (503, ``Retry-After``); any other
exception is a retryable 500 whose traceback is logged once.

The SDK imports nothing of :mod:`watcher` or :mod:`processor`: a handler installs and
runs without them. Its top-level modules may import :mod:`handlers.wire` (the one
ordered folder, at the bottom); :mod:`handlers.examples` imports only the public
:mod:`handlers`.
"""

from __future__ import annotations

from handlers.asgi import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_THREADS,
    HandlerApp,
    HandlerFunction,
    Handlers,
)
from handlers.errors import Fail, HandlerError, ItemDataError, Retry
from handlers.model import UNSET, Item, Reduced, ReducePage, Result, Spawn
from handlers.reduce import Reduce
from handlers.serving import app, serve

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_THREADS",
    "UNSET",
    "Fail",
    "HandlerApp",
    "HandlerError",
    "HandlerFunction",
    "Handlers",
    "Item",
    "ItemDataError",
    "Reduce",
    "ReducePage",
    "Reduced",
    "Result",
    "Retry",
    "Spawn",
    "app",
    "serve",
]
