"""Notify URLs: the check a create makes (http or https, a host, no more than the column
holds), and the check before each send that the host is not a loopback, private,
link-local or otherwise internal address unless the processor allows it.

A receiver URL is chosen by whoever creates a partition; without the second check
they could make the processor POST into its own network (server-side request
forgery). The check resolves the host and refuses the send when any address it
resolves to is internal. The connection then resolves the name again: a DNS server
that answers differently within that moment could still point it elsewhere, so a
processor that must never reach its network belongs behind an egress proxy or
firewall as well (docs/how-to/notifications.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from watcher.errors import InvalidInputError
from watcher.models import NOTIFY_URL_MAX_LENGTH

SCHEMES = ("http", "https")


def check_notify_url(partition_id: str, url: object) -> str | None:
    """A partition's ``notify`` URL, checked; ``None`` when it has none.

    Raises:
        InvalidInputError: ``notify`` is not a string, not an absolute http(s) URL with
            a host, holds spaces or control characters, or is longer than the column
            holds; the message names the field.
    """
    return check_url(f"notify of partition {partition_id!r}", url)


def check_url(name: str, url: object) -> str | None:
    """``url`` checked as a notify URL; ``None`` when it is ``None``. ``name`` is what the
    messages call it (a partition's field, an option).

    Raises:
        InvalidInputError: as :func:`check_notify_url`, the message starting with ``name``.
    """
    if url is None:
        return None
    if not isinstance(url, str):
        raise InvalidInputError(
            f"{name} must be an http(s) URL string, got {type(url).__name__}")
    if not url or len(url) > NOTIFY_URL_MAX_LENGTH:
        raise InvalidInputError(
            f"{name} must be an http(s) URL of 1 to {NOTIFY_URL_MAX_LENGTH} characters")
    if any(char.isspace() or ord(char) < 32 or ord(char) == 127 for char in url):
        raise InvalidInputError(f"{name} must be a URL without spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidInputError(f"{name} is not a valid URL") from None
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidInputError(
            f"{name} must be an http:// or https:// URL, got scheme "
            f"{parts.scheme or '(none)'!r}")
    if not parts.hostname:
        raise InvalidInputError(f"{name} must name a host")
    if port == 0:
        raise InvalidInputError(f"{name} has port 0")
    return url


async def check_default_url(name: str, url: str, *, allow_private: bool) -> str:
    """A processor's default notify URL, checked as a partition's is, and its host as
    each send checks it: an internal address needs ``allow_private``. A host that does
    not resolve now passes (each send checks it again). Returns ``url``.

    Raises:
        InvalidInputError: the URL is not a valid notify URL, or its host resolves to an
            internal address and ``allow_private`` is off; the message starts with
            ``name`` and names no credentials.
    """
    checked = check_url(name, url)
    assert checked is not None
    try:
        refused = await refusal(checked, allow_private=allow_private)
    except LookupError:
        return checked
    if refused is not None:
        raise InvalidInputError(f"{name}: {refused}")
    return checked


SHARED_V4 = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT
# IPv6 prefixes that lead to an IPv4 address: judged by the IPv4 address they embed.
MAPPED_V4 = ipaddress.ip_network("::ffff:0:0/96")
NAT64_V4 = ipaddress.ip_network("64:ff9b::/96")  # the well-known NAT64 prefix
# IPv6 prefixes refused whatever follows, named here so the rule does not depend on a
# Python version's lists: IPv4-compatible (deprecated; with :: and ::1), local-use
# NAT64, Teredo and 6to4 (tunnels to an IPv4 address of the caller's choosing; both
# deprecated for reaching servers), unique local, site-local (deprecated, still
# routed inside some networks), link-local and multicast.
INTERNAL_V6 = tuple(ipaddress.ip_network(prefix) for prefix in (
    "::/96", "64:ff9b:1::/48", "2001::/32", "2002::/16", "fc00::/7", "fec0::/10",
    "fe80::/10", "ff00::/8"))


def internal(address: str) -> bool:
    """Whether an IP address is one a public receiver never has: loopback, private,
    link-local, shared (carrier-grade NAT), multicast, reserved or unspecified; in IPv6
    also unique local, site-local, Teredo, 6to4 and IPv4-compatible addresses. An
    IPv4-mapped address or one under the NAT64 prefix ``64:ff9b::/96`` is judged by the
    IPv4 address it leads to.

    Raises:
        ValueError: ``address`` is not an IP address.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in MAPPED_V4 or ip in NAT64_V4:
            return internal(str(ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)))
        if any(ip in prefix for prefix in INTERNAL_V6) or ip.is_site_local:
            return True
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
            or ip.is_reserved or ip.is_unspecified
            or (isinstance(ip, ipaddress.IPv4Address) and ip in SHARED_V4))


async def refusal(url: str, *, allow_private: bool) -> str | None:
    """Why the processor will not send to ``url`` (``None``: it will): a host that
    resolves to an internal address while ``allow_private`` is off, or one that does
    not resolve (a transient failure: the caller retries)."""
    if allow_private:
        return None
    host = urlsplit(url).hostname or ""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, None, type=socket.SOCK_STREAM)
    except OSError as error:
        raise LookupError(f"cannot resolve {host!r}: {error.strerror or error}") from None
    found = sorted({str(info[4][0]) for info in infos})
    inside = [address for address in found if internal(address)]
    if inside:
        return (f"host {host!r} resolves to an internal address ({inside[0]}); the "
                "processor sends there only with --notify-allow-private")
    return None
