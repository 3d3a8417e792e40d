"""Making a handler app from functions (:func:`app`) and serving it with uvicorn
(:func:`serve`): the SDK's two entry points. The app itself is
:class:`handlers.asgi.HandlerApp`."""

from __future__ import annotations

from typing import Any

from handlers.asgi import (
    DEFAULT_BATCH_PATH,
    DEFAULT_HEALTH_PATH,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PATH,
    DEFAULT_REDUCE_PATH,
    DEFAULT_THREADS,
    HandlerApp,
    Handlers,
)
from handlers.reduce import Reduce, ReduceFunction


def app(handlers: Handlers, *, health_path: str | None = DEFAULT_HEALTH_PATH,
        batch_path: str | None = DEFAULT_BATCH_PATH, path: str = DEFAULT_PATH,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, threads: int = DEFAULT_THREADS,
        reduce: Reduce | ReduceFunction | None = None,
        reduce_path: str = DEFAULT_REDUCE_PATH) -> HandlerApp:
    """Turn a handler function into an ASGI3 app for uvicorn (or any ASGI server).

    ``handlers`` is ``func(item: Item) -> Result`` (sync or async), or a mapping
    ``{gate: func}`` that routes each item by its gate; an item at a gate that
    is not in the mapping fails with a non-retryable 422 naming the gate.

    What the function does decides the answer:

    - returns a :class:`Result` (or a dict of its fields) -> 200 with the result;
    - returns ``None`` -> retryable 500 naming the fix: a forgotten ``return``
      must not silently complete the item nor loop it forever;
    - raises :class:`Retry` -> 503 (with ``Retry-After`` when given);
    - raises :class:`Fail` -> 422, :class:`ItemDataError` -> 400, both ``no_retry``;
    - raises anything else -> 500, retryable, message ``"<Type>: <message>"``;
      the traceback is logged once.

    ``reduce`` serves ``POST /reduce`` for the partition's reduce gates: a
    function ``f(page: ReducePage) -> Reduced`` that answers a whole gate at
    once, or :class:`handlers.Reduce` ``(fold=..., apply=...)`` for gates of any
    size (see :mod:`handlers.reduce`).

    ``health_path`` and ``batch_path`` may be ``None`` to turn those routes off.
    Bodies over ``max_body_bytes`` are refused with a non-retryable 413. Sync
    functions run on up to ``threads`` threads at once (match the processor's
    concurrency when they block on I/O).

    Raises:
        TypeError: a handler is not callable, or a gate key is not an integer >= 0.
        ValueError: the mapping is empty, a path does not start with ``/``, two
            paths are equal, or ``max_body_bytes``/``threads`` is below 1.
    """
    return HandlerApp(handlers, path=path, health_path=health_path, batch_path=batch_path,
                      max_body_bytes=max_body_bytes, threads=threads, reduce=reduce,
                      reduce_path=reduce_path)


def serve(handlers: HandlerApp | Handlers, host: str = "127.0.0.1", port: int = 8000,
          **uvicorn_options: Any) -> None:
    """Serve a handler with uvicorn until interrupted (Ctrl-C, SIGTERM).

    ``handlers`` is an app from :func:`app`, or what :func:`app` takes. Other
    keyword arguments go to ``uvicorn.run``; the access log is off unless
    ``access_log=True`` (one line per item is a lot of lines).

    Raises:
        TypeError, ValueError: :func:`app` refuses ``handlers``.
    """
    import uvicorn  # only the serving process needs it

    asgi = handlers if isinstance(handlers, HandlerApp) else app(handlers)
    uvicorn_options.setdefault("access_log", False)
    uvicorn.run(asgi, host=host, port=port, **uvicorn_options)
