"""The ASGI layer: a plain function (or one per gate) served as an ASGI3 app.

Hand-written on raw ASGI rather than on a framework: a handler's whole job per
request is "read the body, call one function, write one small JSON object", and
a framework's routing, middleware and request objects would cost more than that.

Routes (all configurable):

- ``POST /``: one item (headers and body per :mod:`handlers.wire.contract`);
- ``POST /batch``: a JSON array of items, answered with an array of results;
- ``POST /reduce``: a reduce gate's items (see :mod:`handlers.reduce`), when
  a reduce function is given; ``GET /reduce`` says what it serves:
  ``{"pages": false, "max_body_bytes": N}`` for a plain function (a whole gate
  in one call), ``"pages": true`` for :class:`~handlers.reduce.Reduce`;
- ``GET /healthz``: ``{"status": "ok"}``.

Anything else is a 404 (unknown path) or a 405 (wrong method) with a JSON error
object. Bodies over ``max_body_bytes`` are refused with 413 without being read
further. The user's functions are called, and their outcomes answered, by
:mod:`handlers.calls`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeAlias

from handlers.calls import HandlerFunction, Target, call_handler, call_reduce
from handlers.errors import Fail
from handlers.model import Item
from handlers.reduce import Reduce, ReduceFunction, whole_gate_only
from handlers.responses import (
    Answer,
    Receive,
    Scope,
    Send,
    method_not_allowed,
    respond,
    send_answer,
)
from handlers.wire.contract import (
    BadRequest,
    encode_error,
    parse_batch,
    parse_batch_entry,
    parse_item,
)
from handlers.wire.reduce import parse_reduce

log = logging.getLogger(__name__)

DEFAULT_PATH: Final = "/"
DEFAULT_HEALTH_PATH: Final = "/healthz"
DEFAULT_BATCH_PATH: Final = "/batch"
DEFAULT_REDUCE_PATH: Final = "/reduce"
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
# Matches the processor's default concurrency, so blocking sync handlers (an
# HTTP call with requests, a database query) can keep every dispatched item busy.
DEFAULT_THREADS: Final = 32

Handlers: TypeAlias = HandlerFunction | Mapping[int, HandlerFunction]


_HEALTH_BODY: Final = b'{"status":"ok"}'


class _Disconnected(Exception):
    """The client went away before the request body was complete."""


class HandlerApp:
    """An ASGI3 application serving handler functions; build it with :func:`app`.

    Sync functions run in a thread pool of ``threads`` threads so they never
    block the event loop; async functions run on the loop. The hop to a thread
    costs tens of microseconds per item, so write ``async def`` for functions
    that never block. The pool starts with the first sync call and is shut
    down by the ASGI lifespan shutdown (or :meth:`close`).
    """

    def __init__(self, handlers: Handlers, *, path: str = DEFAULT_PATH,
                 health_path: str | None = DEFAULT_HEALTH_PATH,
                 batch_path: str | None = DEFAULT_BATCH_PATH,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 threads: int = DEFAULT_THREADS,
                 reduce: Reduce | ReduceFunction | None = None,
                 reduce_path: str = DEFAULT_REDUCE_PATH) -> None:
        self._single: Target | None = None
        self._by_gate: dict[int, Target] = {}
        if isinstance(handlers, Mapping):
            if not handlers:
                raise ValueError("app({...}) needs at least one gate: {0: func, ...}")
            for gate, func in handlers.items():
                if type(gate) is not int or gate < 0:
                    raise TypeError(f"gate keys must be integers >= 0, got {gate!r}")
                self._by_gate[gate] = Target(func)
            self._gates_text = ", ".join(str(gate) for gate in sorted(self._by_gate))
        else:
            self._single = Target(handlers)
        if reduce is not None and not callable(reduce):
            raise TypeError(f"reduce must be a function or handlers.Reduce(...), got {reduce!r}")
        # A plain function takes a whole gate; an object (a Reduce, or any class with
        # ``__call__(page)``) is handed every pass and page.
        self._reduce = (None if reduce is None
                        else whole_gate_only(reduce) if inspect.isroutine(reduce)
                        else reduce)
        # What GET on the reduce path answers, so that a processor finds a gate too big
        # for a whole-gate function before any item work: whether paged gates are
        # served, and the largest request taken.
        self._reduce_shape = json.dumps({
            "pages": reduce is not None and not inspect.isroutine(reduce),
            "max_body_bytes": max_body_bytes}).encode()
        routes = {"path": path, "health_path": health_path, "batch_path": batch_path,
                  "reduce_path": reduce_path}
        for name, value in routes.items():
            if value is not None and (not isinstance(value, str) or not value.startswith("/")):
                raise ValueError(f"{name} must be a path starting with '/', got {value!r}")
        taken = [value for value in routes.values() if value is not None]
        if len(set(taken)) != len(taken):
            raise ValueError(f"path, health_path, batch_path and reduce_path must differ, got "
                             f"{routes}")
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or (
                max_body_bytes < 1):
            raise ValueError(f"max_body_bytes must be an integer >= 1, got {max_body_bytes!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        self.path = path
        self.health_path = health_path
        self.batch_path = batch_path
        self.reduce_path = reduce_path
        self.max_body_bytes = max_body_bytes
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._routes_text = "; ".join(
            text for text in (f"POST {path} for one item",
                              batch_path and f"POST {batch_path} for a batch",
                              reduce is not None and f"POST {reduce_path} for a reduce",
                              health_path and f"GET {health_path} for health") if text)

    def __repr__(self) -> str:
        handlers = (self._single.func if self._single is not None
                    else {gate: target.func for gate, target in self._by_gate.items()})
        return (f"HandlerApp({handlers!r}, path={self.path!r}, health_path={self.health_path!r}, "
                f"batch_path={self.batch_path!r})")

    # ------------------------------------------------------------------ ASGI entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection scope (``http``, ``lifespan``; ``websocket`` is closed)."""
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1003})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        try:
            if path == self.path:
                if method != "POST":
                    await method_not_allowed(send, method, path, b"POST")
                    return
                await self._one(scope, receive, send)
            elif path == self.health_path:
                if method not in ("GET", "HEAD"):
                    await method_not_allowed(send, method, path, b"GET, HEAD")
                    return
                await respond(send, 200, _HEALTH_BODY)
            elif path == self.batch_path:
                if method != "POST":
                    await method_not_allowed(send, method, path, b"POST")
                    return
                await self._batch(scope, receive, send)
            elif path == self.reduce_path:
                if method in ("GET", "HEAD") and self._reduce is not None:
                    await respond(send, 200, self._reduce_shape)
                    return
                if method != "POST":
                    await method_not_allowed(send, method, path, b"POST")
                    return
                await self._reduce_request(scope, receive, send)
            else:
                await respond(send, 404, encode_error(
                    f"no route for {method} {path}; this handler serves {self._routes_text}",
                    no_retry=True))
        except _Disconnected:
            log.debug("action=client_disconnected path=%s", path)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def close(self) -> None:
        """Shut the thread pool down (running calls finish). Safe to call twice;
        a later sync call starts a new pool."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    # ------------------------------------------------------------------ requests

    async def _one(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        body = await self._read_body(headers, receive)
        if body is None:
            await self._too_large(send)
            return
        try:
            item = parse_item(headers, body)
        except BadRequest as error:
            await respond(send, error.status, encode_error(error.message, no_retry=True))
            return
        await send_answer(send, await self._settle(item))

    async def _batch(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._read_body(dict(scope["headers"]), receive)
        if body is None:
            await self._too_large(send)
            return
        try:
            entries = parse_batch(body)
        except BadRequest as error:
            await respond(send, error.status, encode_error(error.message, no_retry=True))
            return
        # Entries run concurrently, as the processor would run the same items as
        # separate requests; _entry never raises, so one bad entry spoils nothing.
        parts = await asyncio.gather(*(self._entry(position, entry)
                                       for position, entry in enumerate(entries)))
        await respond(send, 200, b"[" + b",".join(parts) + b"]")

    async def _reduce_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._read_body(dict(scope["headers"]), receive)
        if body is None:
            await self._too_large(send)
            return
        if self._reduce is None:
            await respond(send, 404, encode_error(
                "this handler serves no reduce: pass reduce=... to handlers.app(), or remove "
                "the gate from the partition's reduce_gates", no_retry=True))
            return
        try:
            page = parse_reduce(body)
        except BadRequest as error:
            await respond(send, error.status, encode_error(error.message, no_retry=True))
            return
        await send_answer(send, await call_reduce(self._reduce, page))

    async def _entry(self, position: int, entry: Any) -> bytes:
        try:
            item = parse_batch_entry(position, entry)
        except BadRequest as error:
            return encode_error(error.message, no_retry=True)
        return (await self._settle(item)).body

    async def _read_body(self, headers: Mapping[bytes, bytes], receive: Receive) -> bytes | None:
        """The whole request body, or ``None`` once it exceeds ``max_body_bytes``.

        Raises:
            _Disconnected: the client went away first.
        """
        limit = self.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return None
        message = await receive()
        if message["type"] != "http.request":
            raise _Disconnected
        body = message.get("body", b"")
        if not message.get("more_body", False):  # the common case: one chunk
            return None if len(body) > limit else body
        chunks = [body]
        size = len(body)
        while True:
            if size > limit:
                return None
            message = await receive()
            if message["type"] != "http.request":
                raise _Disconnected
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not message.get("more_body", False):
                break
        return None if size > limit else b"".join(chunks)

    async def _too_large(self, send: Send) -> None:
        await respond(send, 413, encode_error(
            f"the request body is larger than max_body_bytes ({self.max_body_bytes} bytes)",
            no_retry=True))

    # ------------------------------------------------------------------ calling user code

    async def _settle(self, item: Item) -> Answer:
        """Run the handler function for ``item``'s gate (:func:`~handlers.calls.call_handler`)
        and turn any outcome into an answer.

        Never raises (but ``CancelledError``): user errors become error answers.
        """
        target = self._single
        if target is None:
            target = self._by_gate.get(item.gate)
            if target is None:
                message = f"no handler for this gate; this app handles gates {self._gates_text}"
                log.warning("action=unknown_gate partition=%s item=%s gate=%d",
                            item.partition_id, item.id, item.gate)
                return Answer(Fail.status, encode_error(message, no_retry=True))
        return await call_handler(target, item, self._threads)

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads,
                                            thread_name_prefix="statefeed-handler")
        return self._pool

