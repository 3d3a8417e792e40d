"""The console's access rules, pure and through its ASGI guard: which binds need a token,
which hosts and origins are accepted, how the token becomes a session, and the CSRF
token of a session."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from processor.console import security
from processor.console.security import Guard, Keys
from watcher.errors import ConfigError

TOKEN = "a-token-of-twenty-chars"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("127.0.0.2", False), ("0.0.0.0", False), ("::", False),
    ("192.168.1.5", False), ("example.com", False)])
def test_only_three_names_are_loopback(host: str, loopback: bool) -> None:
    assert security.is_loopback(host) is loopback


def test_binds_beyond_loopback_need_a_token() -> None:
    security.check_bind("127.0.0.1", None)
    security.check_bind("0.0.0.0", TOKEN)
    for host in ("0.0.0.0", "127.0.0.2", "10.1.2.3"):
        with pytest.raises(ConfigError, match=f"listens on {host}, beyond loopback.*--token"):
            security.check_bind(host, None)
    with pytest.raises(ConfigError, match="at least 16 characters"):
        security.check_bind("127.0.0.1", "short")
    with pytest.raises(ConfigError, match="--host"):
        security.check_bind("", None)


@pytest.mark.parametrize(("header", "name", "loopback"), [
    ("127.0.0.1:8090", "127.0.0.1", True), ("localhost", "localhost", True),
    ("[::1]:8090", "::1", True), ("LocalHost:1", "localhost", True),
    ("127.0.0.2:80", "127.0.0.2", True), ("evil.example:8090", "evil.example", False),
    ("127.0.0.1.evil.example", "127.0.0.1.evil.example", False), ("", "", False)])
def test_host_headers(header: str, name: str, loopback: bool) -> None:
    assert security.host_name(header) == name
    assert security.loopback_host_header(header) is loopback


@pytest.mark.parametrize(("origin", "referer", "ok"), [
    ("http://127.0.0.1:8090", None, True),
    ("https://127.0.0.1:8090", None, True),  # behind a TLS proxy the scheme differs
    (None, "http://127.0.0.1:8090/partition?id=x", True),
    ("http://evil.example", "http://127.0.0.1:8090/", False),  # Origin decides
    ("http://127.0.0.1:8091", None, False),
    ("null", None, False), (None, None, False), ("", "", False),
    ("javascript://127.0.0.1:8090", None, False)])
def test_same_origin(origin: str | None, referer: str | None, ok: bool) -> None:
    assert security.same_origin(origin, referer, "127.0.0.1:8090") is ok


def test_tokens_and_bearer_headers() -> None:
    assert security.token_matches(TOKEN, TOKEN)
    assert not security.token_matches(TOKEN + "x", TOKEN)
    assert not security.token_matches(None, TOKEN)
    assert security.bearer(f"Bearer {TOKEN}") == TOKEN
    assert security.bearer(f"bearer  {TOKEN} ") == TOKEN
    assert security.bearer(f"Basic {TOKEN}") is None
    assert security.bearer("Bearer ") is None and security.bearer(None) is None


def test_sessions_are_signed_with_the_token() -> None:
    keys = Keys(TOKEN)
    cookie = keys.cookie("session1")
    assert cookie.startswith("session1.") and TOKEN not in cookie
    assert keys.session_of(cookie) == ("session1", True)
    assert keys.session_of("session1") == ("session1", False)  # unsigned
    assert keys.session_of("session1.forged") == ("session1", False)
    assert Keys(TOKEN + "-other").session_of(cookie)[1] is False  # another token
    assert Keys(TOKEN, secret=keys.secret).session_of(cookie)[1] is True
    for bad in (None, "", ".sig", "a b.c", "x" * 65):
        assert keys.session_of(bad) == (None, False)
    open_keys = Keys(None)
    assert open_keys.cookie("s") == "s" and open_keys.session_of("s") == ("s", True)


def test_csrf_tokens_belong_to_one_session_and_one_process() -> None:
    keys = Keys(None)
    token = keys.csrf("session1")
    assert keys.csrf_matches("session1", token)
    assert not keys.csrf_matches("session2", token)
    assert not keys.csrf_matches("session1", None)
    assert not keys.csrf_matches(None, token)
    assert not Keys(None).csrf_matches("session1", token)  # a restarted console


def test_redirect_targets() -> None:
    assert security.without_token("/partitions", f"status=failed&token={TOKEN}") == \
        "/partitions?status=failed"
    assert security.without_token("/", f"token={TOKEN}") == "/"
    assert security.local_path("/partition?id=x") == "/partition?id=x"
    for outside in ("//evil.example/", "https://evil.example/", "/\\evil", "", None):
        assert security.local_path(outside) == "/"


async def _inner(request: Request) -> Response:
    access = request.scope["state"]["access"]
    return PlainTextResponse(f"session={access.session}")


async def _unauthorised(scope, receive, send) -> None:
    await PlainTextResponse("sign in", status_code=401)(scope, receive, send)


def _client(*, token: str | None, loopback_only: bool, host: str) -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/", _inner), Route("/static/x.css", _inner),
                            Route("/partitions", _inner)])
    guard = Guard(app, keys=Keys(token), loopback_only=loopback_only, port=8090,
                  unauthorised=_unauthorised)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=guard),
                             base_url=f"http://{host}")


async def test_a_loopback_console_answers_loopback_names_only() -> None:
    async with _client(token=None, loopback_only=True, host="127.0.0.1:8090") as client:
        answer = await client.get("/")
        assert answer.status_code == 200
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith("statefeed_console_8090=") and "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
        assert answer.headers["x-frame-options"] == "DENY"
        # The session sticks: the same cookie comes back, no new one is set.
        again = await client.get("/")
        assert again.text == answer.text and "set-cookie" not in again.headers
        rebound = await client.get("/", headers={"host": "attacker.example:8090"})
        assert rebound.status_code == 421


async def test_without_the_token_a_console_answers_401() -> None:
    async with _client(token=TOKEN, loopback_only=False, host="10.0.0.5:8090") as client:
        for path in ("/", "/partitions?status=failed"):
            answer = await client.get(path)
            assert answer.status_code == 401 and answer.text == "sign in"
            assert answer.headers["x-content-type-options"] == "nosniff"
        assert (await client.get("/?token=wrong-token-of-20-chars")).status_code == 401
        assert (await client.get("/", headers={"authorization": "Bearer nope"})
                ).status_code == 401
        assert (await client.get("/static/x.css")).status_code == 200  # the sign-in's CSS


async def test_the_token_once_then_a_cookie() -> None:
    async with _client(token=TOKEN, loopback_only=False, host="10.0.0.5:8090") as client:
        answer = await client.get(f"/partitions?status=failed&token={TOKEN}")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/partitions?status=failed"  # token dropped
        cookie = answer.headers["set-cookie"]
        assert TOKEN not in cookie and "HttpOnly" in cookie
        assert (await client.get("/partitions")).status_code == 200  # by the cookie
        client.cookies.clear()
        assert (await client.get("/")).status_code == 401
        bearer = await client.get("/", headers={"authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200 and "set-cookie" not in bearer.headers
