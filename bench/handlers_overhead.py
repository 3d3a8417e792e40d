"""How much the handlers SDK costs per request, against a bare ASGI app.

Serves, one at a time, each in its own uvicorn subprocess on loopback:

- ``raw``: a hand-written ASGI app that reads the body and answers ``{"done":true}``;
- ``sdk-async``: ``handlers.app(echo)`` with the async echo example;
- ``sdk-sync``: ``handlers.app(sync_echo)``, the same function written sync (thread hop);

and drives each with ``--requests`` contract-shaped POSTs over ``--concurrency``
keep-alive HTTP/1.1 connections (a minimal asyncio client, so the client costs
less than the server). Each variant runs ``--rounds`` times, interleaved; the
best round counts. Prints requests per second and the SDK's overhead as a
ratio and in microseconds per request, and each app's cost per call measured
in-process (no server, no sockets), which is steadier.

    .venv/bin/python bench/handlers_overhead.py --requests 20000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

import handlers  # noqa: E402
from handlers.examples.echo import echo  # noqa: E402

VARIANTS = ("raw", "sdk-async", "sdk-sync")
MAX_REQUESTS = 1_000_000
MAX_CONCURRENCY = 1_000
STARTUP_TIMEOUT = 15.0
REQUEST_TIMEOUT = 10.0
WARMUP_REQUESTS = 500

_RAW_BODY = b'{"done":true}'
_RAW_HEADERS = [(b"content-type", b"application/json"),
                (b"content-length", str(len(_RAW_BODY)).encode())]


async def raw_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The baseline: read the whole body, answer a fixed JSON object."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _RAW_HEADERS})
    await send({"type": "http.response.body", "body": _RAW_BODY})


def sync_echo(item: handlers.Item) -> handlers.Result:
    """The echo example as a sync function: runs in the SDK's thread pool."""
    return handlers.Result(done=True)


def _app_for(variant: str) -> Any:
    if variant == "raw":
        return raw_app
    if variant == "sdk-async":
        return handlers.app(echo)
    return handlers.app(sync_echo)


def _serve(variant: str, port: int) -> None:
    import uvicorn

    uvicorn.run(_app_for(variant), host="127.0.0.1", port=port, log_level="warning",
                access_log=False, lifespan="off")


# --------------------------------------------------------------------------- client


def _request(body: bytes) -> bytes:
    head = (
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
        "X-Partition-Id: bench\r\nX-Item-Id: item-1\r\nX-Gate: 0\r\nX-Attempt: 1\r\n"
        f"Idempotency-Key: bench/item-1/0\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


async def _connection(port: int, request: bytes, budget: Iterator[int]) -> int:
    """Send requests on one keep-alive connection while the budget lasts; return
    how many were answered 200.

    Raises:
        RuntimeError: an answer was not 200 or had no Content-Length.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answered = 0
    try:
        for _ in budget:
            writer.write(request)
            async with asyncio.timeout(REQUEST_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
                status = head[9:12]
                length = None
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if status != b"200" or length is None:
                    raise RuntimeError(f"unexpected answer: {head[:200]!r}")
                await reader.readexactly(length)
            answered += 1
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return answered


async def _drive(port: int, requests: int, concurrency: int, body: bytes) -> float:
    """Send ``requests`` over ``concurrency`` connections; return requests per second.

    Raises:
        RuntimeError: a request failed.
    """
    request = _request(body)
    budget = iter(range(requests))  # shared: each connection takes the next number
    started = time.perf_counter()
    done = await asyncio.gather(*(_connection(port, request, budget)
                                  for _ in range(min(concurrency, requests))))
    elapsed = time.perf_counter() - started
    if sum(done) != requests:
        raise RuntimeError(f"{sum(done)} of {requests} requests answered")
    return requests / elapsed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _wait_listening(port: int, server: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if server.returncode is not None:
            raise RuntimeError(f"the server exited with code {server.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no server on port {port} after {STARTUP_TIMEOUT} s") from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return


async def _measure(variant: str, requests: int, concurrency: int, body: bytes) -> float:
    port = _free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", variant, "--port", str(port), cwd=REPO)
    try:
        await _wait_listening(port, server)
        await _drive(port, min(WARMUP_REQUESTS, requests), concurrency, body)
        return await _drive(port, requests, concurrency, body)
    finally:
        if server.returncode is None:
            server.terminate()
        try:
            async with asyncio.timeout(10):
                await server.wait()
        except TimeoutError:
            server.kill()
            await server.wait()


@dataclass
class Figures:
    variant: str
    best: float
    rounds: list[float]
    in_process_us: float


async def _in_process(variant: str, calls: int, concurrency: int, body: bytes) -> float:
    """Microseconds per call of the ASGI app alone (no server, no sockets): the
    SDK's own cost, free of the noise of two processes sharing the CPUs."""
    app = _app_for(variant)
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [
        (b"host", b"127.0.0.1"), (b"content-type", b"application/octet-stream"),
        (b"x-partition-id", b"bench"), (b"x-item-id", b"item-1"), (b"x-gate", b"0"),
        (b"x-attempt", b"1"), (b"idempotency-key", b"bench/item-1/0"),
        (b"content-length", str(len(body)).encode())]}
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    async def send(_: dict[str, Any]) -> None:
        return None

    async def caller(count: int) -> None:
        for _ in range(count):
            await app(scope, receive, send)

    lanes = min(concurrency, calls)
    started = time.perf_counter()
    await asyncio.gather(*(caller(calls // lanes) for _ in range(lanes)))
    elapsed = time.perf_counter() - started
    if hasattr(app, "close"):
        app.close()
    return elapsed / (calls // lanes * lanes) * 1e6


async def _run(args: argparse.Namespace) -> list[Figures]:
    body = b'{"name":"Ada","text":"' + b"x" * max(args.body_bytes - 24, 0) + b'"}'
    results: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            results[variant].append(
                await _measure(variant, args.requests, args.concurrency, body))
    calls = min(args.requests, 50_000)
    return [Figures(variant, max(rates), rates,
                    await _in_process(variant, calls, args.concurrency, body))
            for variant, rates in results.items()]


def _report(figures: list[Figures], args: argparse.Namespace) -> None:
    import uvicorn

    print(f"uvicorn {uvicorn.__version__} (h11, asyncio loop), Python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.requests} requests x "
          f"{args.rounds} rounds, concurrency {args.concurrency}, {args.body_bytes}-byte body")
    raw = figures[0].best
    print(f"{'variant':<10} {'best req/s':>11} {'vs raw':>7} {'+us/req':>8} "
          f"{'app us/call':>12}   rounds (req/s)")
    for figure in figures:
        extra = (1 / figure.best - 1 / raw) * 1e6
        rounds = ", ".join(f"{rate:,.0f}" for rate in figure.rounds)
        print(f"{figure.variant:<10} {figure.best:>11,.0f} {figure.best / raw:>7.2f} "
              f"{extra:>8.1f} {figure.in_process_us:>12.1f}   {rounds}")
    print("+us/req: extra server time per request over HTTP (noisy: client and server "
          "share the CPUs); app us/call: the ASGI app alone, called in-process")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.port)
        return 0
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be from 1 to {MAX_REQUESTS}")
    if not 1 <= args.concurrency <= MAX_CONCURRENCY:
        parser.error(f"--concurrency must be from 1 to {MAX_CONCURRENCY}")
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds must be from 1 to 20")
    _report(asyncio.run(_run(args)), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
