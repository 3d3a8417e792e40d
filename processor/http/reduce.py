"""The reduce call over HTTP: one request per reduce gate, or per page of a big one.

When a partition's reduce gate becomes its current gate, the engine hands each
:class:`~watcher.protocol.ReduceCall` here; it is POSTed as JSON to the
handler's reduce URL (``<handler-url>/reduce`` by default) and the answer is
read by :func:`processor.wire.reduce.read_reduce_reply`. The connections, secrets and
error words are the :class:`~processor.http.endpoint.HandlerEndpoint`'s, so a
reduce goes through the same pooled sender as the item calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx

from processor.http.config import beside_handler, split_userinfo
from processor.http.endpoint import HandlerEndpoint
from processor.http.transports import TransportError
from processor.observe.redact import redact_url
from processor.wire.errors import unexpected_failure
from processor.wire.reduce import encode_reduce, read_reduce_reply, reduce_error, reduce_headers
from processor.wire.values import Failure
from watcher.protocol import ReduceCall, ReduceResult, ReduceShape

log = logging.getLogger(__name__)

DEFAULT_REDUCE_PATH = "/reduce"
# How long the question "what does your reduce take?" may wait for its answer.
SHAPE_TIMEOUT = 10.0


def default_reduce_url(handler_url: str) -> str:
    """``<handler-url>/reduce``, without doubling the slash, the handler URL's query
    string after it (:func:`~processor.http.config.beside_handler`)."""
    return beside_handler(handler_url, DEFAULT_REDUCE_PATH)


class HttpReducer:
    """Sends reduce calls to the handler's reduce URL through an endpoint's sender.

    ``endpoint`` is a :class:`~processor.http.endpoint.HandlerEndpoint`; its
    config's ``reduce_url`` (or the default) is where the calls go.
    """

    def __init__(self, endpoint: HandlerEndpoint) -> None:
        config = endpoint.config
        url = config.reduce_url or default_reduce_url(config.handler_url)
        bare, basic_auth = split_userinfo(url)
        self.endpoint = endpoint
        self.url = str(httpx.URL(bare))
        self.shown_url = redact_url(url)
        self._basic_auth = basic_auth
        self._shape: ReduceShape | None = None
        self._shape_asked = False  # the handler answered the question (whatever it said)
        self._asking = asyncio.Lock()

    async def shape(self) -> ReduceShape | None:
        """What the handler's reduce takes: ``GET`` on the reduce URL, which the Python
        SDK answers with ``{"pages": bool, "max_body_bytes": int}``. ``None`` when the
        handler does not say (another kind of handler: a 404 or 405) or cannot answer
        now (no answer, or a 5xx: asked again next time). Never raises.
        """
        if self._shape_asked:
            return self._shape
        async with self._asking:  # many partitions leased at once ask once
            if self._shape_asked:
                return self._shape
            return await self._ask_shape()

    async def _ask_shape(self) -> ReduceShape | None:
        headers = {"Authorization": self._basic_auth} if self._basic_auth else {}
        try:
            async with asyncio.timeout(min(SHAPE_TIMEOUT,
                                           self.endpoint.config.request_timeout)):
                reply = await self.endpoint.sender.probe(self.url, headers,
                                                         shown_url=self.shown_url)
        except (TimeoutError, TransportError):
            return None
        except Exception as error:  # a bug here must not stop the partition
            log.error("action=reduce_shape_bug error=%s", type(error).__name__)
            return None
        if reply.status >= 500:  # down for now: ask again next time
            return None
        self._shape_asked = True
        self._shape = _read_shape(reply.status, reply.body)
        if self._shape is not None:
            log.info("action=reduce_shape url=%s pages=%s max_body_bytes=%s", self.shown_url,
                     self._shape.pages, self._shape.max_request_bytes)
        return self._shape

    async def reduce(self, call: ReduceCall) -> ReduceResult:
        """POST ``call`` and read the handler's answer.

        Raises:
            RetryableError: the call failed but may succeed later (5xx, 408, 429,
                timeout, connection failure, malformed answer).
            NonRetryableError: the handler refused it for good (4xx other than
                408 and 429, a redirect, or ``no_retry``).
        """
        endpoint = self.endpoint
        try:
            headers = reduce_headers(call)
            if self._basic_auth:
                headers["Authorization"] = self._basic_auth
            if endpoint.tracer is not None:
                endpoint.tracer.inject(headers)
            reply = await endpoint.post(self.url, encode_reduce(call), headers,
                                        shown_url=self.shown_url)
            outcome = reply if isinstance(reply, Failure) else read_reduce_reply(
                reply, call, max_bytes=endpoint.config.max_response_bytes,
                mask=endpoint.mask, clock=time.time)
        except Exception as error:  # a bug here must fail the reduce call, not the engine
            log.error("action=reduce_call_bug partition=%s gate=%d error=%s",
                      call.partition_id, call.gate, type(error).__name__)
            raise reduce_error(call, unexpected_failure(error, "calling the reduce"),
                               endpoint.mask) from None
        if isinstance(outcome, Failure):
            log.debug("action=reduce_call_failed partition=%s gate=%d pass=%s page=%d "
                      "retryable=%s", call.partition_id, call.gate, call.pass_, call.page,
                      outcome.retryable)
            raise reduce_error(call, outcome, endpoint.mask)
        return outcome



def _read_shape(status: int, body: bytes | None) -> ReduceShape | None:
    """The :class:`ReduceShape` a ``GET`` on the reduce URL answered, if it says one."""
    if status != 200 or not body:
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("pages"), bool):
        return None
    limit = document.get("max_body_bytes")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        limit = None
    return ReduceShape(document["pages"], limit)
