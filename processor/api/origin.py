"""Which requests may change state: the ingest API's cross-site rule, as the console's.

A web page the operator has open can send a "simple" POST to the API on loopback
(``Content-Type: text/plain``, no preflight), and partition ids are guessable. So
every method but GET, HEAD and OPTIONS, on every route present or future, is refused
(403 ``cross_site_request``) when the browser says it comes from elsewhere:

- ``Sec-Fetch-Site`` is present and is not ``same-origin`` or ``none`` (the user's
  own action), or
- ``Origin`` (or, without one, ``Referer``) is present and does not name the host
  the request was sent to (``null`` included).

A request that says neither (curl, the SDKs, scripts) is no browser's and goes on;
so does one with ``Authorization: Bearer``, which no page can add without a
preflight the API never grants. And a body must be JSON or NDJSON: any other
``Content-Type`` on such a method is refused (415 ``unsupported_media_type``), so a
form or ``text/plain`` body is never read. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from processor.api.problems import ApiError, unsupported_media
from processor.api.upload import JSON_TYPES, NDJSON_TYPES
from processor.console.security import bearer, same_origin

SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
# Sec-Fetch-Site values of a request the page's own origin (or the user) made.
OWN_SITES: Final = frozenset({"same-origin", "none"})
BODY_TYPES: Final = JSON_TYPES | NDJSON_TYPES


def cross_site_refusal(method: str, headers: Mapping[str, str]) -> ApiError | None:
    """The refusal of a state-changing request a browser sent from another site, or of
    its body's media type; ``None`` when it may go on. ``headers``: lower-cased names.
    Never raises."""
    if method.upper() in SAFE_METHODS:
        return None
    if bearer(headers.get("authorization")) is None:
        source = _foreign_source(headers)
        if source is not None:
            return ApiError(403, "cross_site_request", (
                f"refused: a browser sent this {method.upper()} from {source}, another site "
                "than this API's; a web page may not change statefeed's state. Call the "
                "API from a script or the SDK (no Origin header), or send "
                "'Authorization: Bearer <token>'"))
    media = headers.get("content-type")
    if media is not None and media.split(";")[0].strip().lower() not in BODY_TYPES:
        return unsupported_media(media, ndjson=True)
    return None


def _foreign_source(headers: Mapping[str, str]) -> str | None:
    """What shows the request came from another site (the ``Origin``, the ``Referer`` or
    ``Sec-Fetch-Site``, quoted), or ``None``."""
    site = headers.get("sec-fetch-site")
    origin = headers.get("origin")
    referer = headers.get("referer")
    host = headers.get("host", "")
    if site is not None and site.strip().lower() not in OWN_SITES:
        return f"{origin or referer or 'a page'!r} (Sec-Fetch-Site: {site.strip()})"
    if origin is not None:
        return None if same_origin(origin, None, host) else repr(origin)
    if referer is not None:
        return None if same_origin(None, referer, host) else repr(referer)
    return None
