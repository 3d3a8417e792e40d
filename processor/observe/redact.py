"""Keep secrets out of messages: URL redaction and scrubbing of known secret values.

A handler URL may carry a password (``http://user:pass@host``) or a key in its
query string (``?code=...``, as Azure Functions use); configured handler headers
carry tokens (``Authorization: Bearer ...``). Nothing of those may reach an
exception message, a ``repr`` or a log line.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

MASK = "***"

# Shorter values are not scrubbed from text: replacing "1" or "ok" everywhere
# would garble gate numbers and words, and values that short are no secret.
MIN_SECRET_LENGTH = 4


def redact_url(url: str) -> str:
    """Return ``url`` with the userinfo password and every query value replaced by ``***``.

    The user name, host, port, path and query keys stay visible. Never raises:
    text that cannot be parsed as a URL comes back as ``<unparseable URL>``.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, has_password, _ = userinfo.partition(":")
            netloc = f"{user}:{MASK}@{hostport}" if has_password else f"{user}@{hostport}"
        query = parts.query
        if query:
            query = "&".join(
                f"{key}={MASK}" if has_value else key
                for key, has_value, _ in (pair.partition("=") for pair in query.split("&"))
            )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<unparseable URL>"


def url_secrets(url: str) -> list[str]:
    """The secret parts of ``url``: its password and query values, raw and percent-decoded."""
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
        found.extend(value for _, value in parse_qsl(parts.query, keep_blank_values=False))
        found.extend(pair.partition("=")[2] for pair in parts.query.split("&"))
    except ValueError:
        return []
    return [variant for value in found for variant in (value, unquote(value))]


def header_secrets(value: str) -> list[str]:
    """The secret parts of a header value: the whole value and, for ``Scheme token``, the token.

    A handler that echoes only the token (without ``Bearer``) is still scrubbed.
    """
    scheme, _, credentials = value.strip().partition(" ")
    return [value, value.strip(), credentials.strip()] if credentials else [value, scheme]


class Scrubber:
    """Replaces known secret values in text with ``***``.

    Built once from the secrets (header values, URL passwords); calling it on a
    message is cheap when no secret is configured.
    """

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str]) -> None:
        unique = {s for s in secrets if len(s) >= MIN_SECRET_LENGTH}
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = tuple(sorted(unique, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        """Return ``text`` with every known secret replaced by ``***``."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def __repr__(self) -> str:
        return f"Scrubber(<{len(self._secrets)} secrets>)"
