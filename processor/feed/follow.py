"""Follow a partition's live feed over HTTP (``processor watch``): read the events as they
come, and reconnect with ``Last-Event-ID`` when the connection drops, so that no gate
move is lost or repeated.

A refusal (401, 404, 400) ends at once with the API's one-line message; a dropped or
refused connection (the API restarting, a proxy's timeout, 503) is retried with a
growing pause, for up to :attr:`FollowOptions.reconnect_for` seconds without a
successful connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from processor.feed.events import END, Received, parse_stream

RETRY_FIRST = 0.25
RETRY_MAX = 5.0
# Longer than the API's heartbeat (15 s) twice over: a silent connection is a dead one.
READ_TIMEOUT = 45.0
CONNECT_TIMEOUT = 10.0


class FeedRefusedError(Exception):
    """The API refused the feed for good (a bad token, an unknown partition, a bad
    option); the message is its own, on one line."""


class FeedLostError(Exception):
    """No connection to the API succeeded for :attr:`FollowOptions.reconnect_for` seconds."""


@dataclass(frozen=True)
class FollowOptions:
    """Where the API is (``api_url``, its ``token`` if it has one), how often counts may
    come (``interval_ms``), and how long to keep reconnecting (``reconnect_for``)."""

    api_url: str
    token: str | None = None
    interval_ms: int = 500
    reconnect_for: float = 60.0


def feed_url(api_url: str, partition_id: str) -> str:
    """The feed's address under ``api_url`` (the id percent-encoded as one segment)."""
    return f"{api_url.rstrip('/')}/v1/partitions/{quote(partition_id, safe='')}/events"


def follow(partition_id: str, options: FollowOptions, on_event: Callable[[Received], None],
           on_retry: Callable[[str], None] = lambda reason: None) -> Received | None:
    """Read the feed of ``partition_id``, calling ``on_event`` with each event, until its
    end; returns the end event (``None`` when the API said the end had been sent).

    Raises:
        FeedRefusedError: the API refused the request (the message says why).
        FeedLostError: the API could not be reached for ``reconnect_for`` seconds.
    """
    last_id: str | None = None
    failing_since: float | None = None
    pause = RETRY_FIRST
    timeout = httpx.Timeout(CONNECT_TIMEOUT, read=READ_TIMEOUT)
    with httpx.Client(timeout=timeout) as http:
        while True:
            headers = {"accept": "text/event-stream"}
            if options.token:
                headers["authorization"] = f"Bearer {options.token}"
            if last_id is not None:
                headers["last-event-id"] = last_id
            reason = "the stream closed before the end"
            try:
                with http.stream("GET", feed_url(options.api_url, partition_id),
                                 params={"interval": str(options.interval_ms)},
                                 headers=headers) as response:
                    if response.status_code == 204:
                        return None
                    if response.status_code == 200:
                        failing_since, pause = None, RETRY_FIRST
                        for event in parse_stream(response.iter_lines()):
                            if event.id is not None:
                                last_id = event.id
                            on_event(event)
                            if event.kind == END:
                                return event
                    else:
                        response.read()
                        message = _problem(response)
                        if response.status_code not in (502, 503, 504):
                            raise FeedRefusedError(message)
                        reason = message
            except httpx.TransportError as error:
                reason = f"{type(error).__name__}: {error or 'connection lost'}"
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > options.reconnect_for:
                raise FeedLostError(f"the API at {options.api_url} was not reachable for "
                                    f"{options.reconnect_for:g} s ({reason})")
            on_retry(reason)
            time.sleep(pause)
            pause = min(RETRY_MAX, pause * 2)


def _problem(response: httpx.Response) -> str:
    """The API's error message (its one error shape), or the status line."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"the API answered {response.status_code} {response.reason_phrase}"
    return f"{message} (HTTP {response.status_code})"
