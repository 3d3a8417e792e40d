"""Reading the console's POSTed forms and query numbers, the pages' addresses, and the
redirect that follows an action."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse

# A form is an id and a token: a larger body is refused unread.
MAX_FORM_BYTES = 16_384


def see_other(location: str) -> RedirectResponse:
    """303 to ``location``: the browser GETs the page an action leads to."""
    return RedirectResponse(location, status_code=303)


class Form(dict[str, str]):
    """A POSTed form: each field's last value, as a dict; :meth:`every` gives all the
    values of a field sent several times (the ticked boxes of a list)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs

    def every(self, name: str) -> list[str]:
        """Every value sent for ``name``, in the order sent."""
        return [value for field, value in self.pairs if field == name]


async def read_form(request: Request) -> Form | None:
    """A urlencoded form body of at most :data:`MAX_FORM_BYTES`, or ``None``."""
    if request.headers.get("content-type", "").split(";")[0].strip() != \
            "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        return Form(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    except (UnicodeDecodeError, ValueError):
        return None


def page_url(path: str, **params: Any) -> str:
    """``path`` with ``params`` as its query string (empty and ``None`` values left out)."""
    kept = {key: value for key, value in params.items() if value not in (None, "")}
    return path + (f"?{urlencode(kept)}" if kept else "")


def count_param(text: str | None) -> int:
    """A count from a query parameter: a whole number from 0 (anything else is 0)."""
    try:
        return max(0, int(text or "0"))
    except ValueError:
        return 0
