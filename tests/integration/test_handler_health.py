"""Readiness includes the handler by default: ``processor run`` checks
``<handler-url>/healthz`` (processor/cli/serve.py), where a handler that serves no such
route counts as healthy while it answers. Real uvicorn handlers (the SDK) on loopback,
through the processor's own HTTP stack."""

from __future__ import annotations

import pytest

import handlers
from processor.http.config import HttpProcessorConfig, beside_handler, default_health_url
from processor.http.processor import HttpProcessor
from tests.support.servers import free_port, serve_app


def _done(item: handlers.Item) -> handlers.Result:
    return handlers.Result(done=True)


WITH_HEALTH = handlers.app(_done)
WITHOUT_HEALTH = handlers.app(_done, health_path=None)


@pytest.mark.parametrize(("handler_url", "health_url"), [
    ("http://h:8000", "http://h:8000/healthz"),
    ("http://h:8000/", "http://h:8000/healthz"),
    ("http://h/process", "http://h/process/healthz"),
    ("https://u:p@h/x/?token=t#frag", "https://u:p@h/x/healthz?token=t"),
])
def test_the_default_health_url_is_beside_the_handler_url(handler_url: str,
                                                          health_url: str) -> None:
    assert default_health_url(handler_url) == health_url
    # The batch and reduce defaults keep a query string after their path the same way.
    assert beside_handler("http://h/?token=t", "/reduce") == "http://h/reduce?token=t"


async def _check(handler_url: str, *, optional: bool) -> tuple[bool, str]:
    config = HttpProcessorConfig(handler_url=handler_url,
                                 health_url=default_health_url(handler_url),
                                 health_optional=optional)
    async with HttpProcessor(config) as processor:
        return await processor.check_health()


async def test_a_handler_that_serves_the_route_is_checked_there() -> None:
    async with serve_app(WITH_HEALTH) as url:
        ok, detail = await _check(f"{url}/", optional=True)
    assert ok and detail.endswith("/healthz answered HTTP 200"), detail


async def test_a_handler_without_the_route_counts_as_healthy_while_it_answers() -> None:
    async with serve_app(WITHOUT_HEALTH) as url:
        ok, detail = await _check(f"{url}/", optional=True)
        assert ok and "answered HTTP 404" in detail and "no health route" in detail, detail
        # A health URL given, not guessed: its 404 is a failure, as before.
        given, detail = await _check(f"{url}/", optional=False)
        assert not given and detail.endswith("answered HTTP 404"), detail


async def test_a_handler_that_does_not_answer_is_not_ready() -> None:
    ok, detail = await _check(f"http://127.0.0.1:{free_port()}/", optional=True)
    assert not ok and "healthz" in detail, detail
