"""Headless Chromium for the console's tests, through Playwright, with the system's
Chromium (Debian's ``chromium``; ``.ci/run`` installs it). No browser is downloaded.

Without Chromium (or Playwright) the tests skip, saying what is missing; with ``CI``
set they fail instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
# Headless, no sandbox (tests run as root), and nothing that reaches the internet.
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync")


def chromium_path() -> str | None:
    """The system Chromium: ``PROCESSOR_TEST_CHROMIUM``, or Debian's, or ``None``."""
    named = os.environ.get("PROCESSOR_TEST_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for candidate in CHROMIUM_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium")


def require_chromium() -> str:
    """The Chromium to launch; skips the test (fails it when ``CI`` is set) without one
    or without Playwright."""
    problem = None
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        problem = "the playwright package is not installed (pip install -e '.[test,browser]')"
    path = chromium_path()
    if problem is None and path is None:
        problem = ("Chromium is not installed (apt-get install chromium, as .ci/run does; "
                   "or set PROCESSOR_TEST_CHROMIUM)")
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI must run the browser tests", pytrace=False)
        pytest.skip(problem)
    assert path is not None
    return path


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """A headless Chromium (a Playwright ``Browser``) for the block."""
    path = require_chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=path,
                                                   args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            await browser.close()
