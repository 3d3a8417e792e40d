"""httpx's API over aiohttp's connection pool, with connection errors named correctly.

``httpx-aiohttp`` maps every aiohttp connection error to ``httpx.ConnectTimeout``,
including a refused connection and a keep-alive connection the server closed.
The processor words its errors and decides its one transport retry by the
exception type, so this wrapper restores the httpx types: a failed connect is
``ConnectError``, a dropped connection is ``RemoteProtocolError``.
"""

from __future__ import annotations

import ssl

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport


class _CorrectedAiohttpTransport(AiohttpTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.ConnectTimeout as error:
            cause = error.__cause__
            if isinstance(cause, aiohttp.ClientConnectorError):
                raise httpx.ConnectError(str(cause), request=request) from cause
            if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(
                    cause, aiohttp.ServerTimeoutError):
                raise httpx.RemoteProtocolError(str(cause), request=request) from cause
            raise


def aiohttp_transport(*, verify: bool | ssl.SSLContext, limits: httpx.Limits
                      ) -> httpx.AsyncBaseTransport:
    """An httpx transport that sends requests through aiohttp."""
    return _CorrectedAiohttpTransport(verify=verify, limits=limits, trust_env=False)
