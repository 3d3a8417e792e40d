"""The test kit's pytest plugin, loaded by the ``pytest11`` entry point ``statefeed``.

The ``statefeed`` fixture is a factory: ``statefeed(app, **options)`` is a
:class:`~processor.testing.kit.HandlerKit` (its options), with its database in the
test's ``tmp_path``; use it as ``async with statefeed(app) as kit:`` under any async
test runner (pytest-asyncio, anyio) or in ``asyncio.run``. ``pytest
--statefeed-calls-twice`` runs every such kit in calls-twice mode, unless the test
says otherwise.

This module imports only pytest: the kit loads when a test first asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from processor.testing.kit import HandlerKit

CALLS_TWICE_OPTION = "--statefeed-calls-twice"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("statefeed", "statefeed handler test kit")
    group.addoption(CALLS_TWICE_OPTION, action="store_true", default=False,
                    help="run every kit of the statefeed fixture in calls-twice mode: each "
                         "item's call sent twice, out of order; a test fails when the two "
                         "answers differ")


@pytest.fixture
def statefeed(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., HandlerKit]:
    """A factory of test kits: ``async with statefeed(app) as kit:``."""
    from processor.testing.kit import HandlerKit

    calls_twice = bool(request.config.getoption(CALLS_TWICE_OPTION))
    made = 0

    def make(app: Any, **options: Any) -> HandlerKit:
        nonlocal made
        made += 1
        folder = tmp_path / f"statefeed-{made}"
        folder.mkdir()
        options.setdefault("calls_twice", calls_twice)
        options.setdefault("folder", folder)
        return HandlerKit(app, **options)

    return make
