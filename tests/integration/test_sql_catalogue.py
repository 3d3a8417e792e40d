"""The checked-in SQL catalogues (``docs/sql/*.sql``) hold what each database receives.

Each test records the catalogue anew (:mod:`tests.support.catalogue`) and fails,
with the differing lines and the command that refreshes the files, when the
checked-in one is stale: a change to a statement shows in review as a SQL diff.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from tests.conftest import MARIADB_URL, POSTGRES_URL, require_mariadb, require_postgres
from tests.support.catalogue import (
    DATABASES,
    REFRESH,
    catalogue_path,
    render,
    same_statements,
)


@pytest.mark.parametrize("database", DATABASES)
async def test_the_sql_catalogue_is_current(database: str, tmp_path: Path) -> None:
    if database == "postgresql":
        require_postgres()
    if database == "mariadb":
        require_mariadb()
    recorded = await render(database, postgres_url=POSTGRES_URL, mariadb_url=MARIADB_URL,
                            scratch=tmp_path)
    assert "-- name: items_apply" in recorded and "-- name: leases_take" in recorded
    path = catalogue_path(database)
    checked_in = path.read_text() if path.exists() else ""
    if not same_statements(recorded, checked_in):
        diff = "\n".join(list(difflib.unified_diff(
            checked_in.splitlines(), recorded.splitlines(), str(path), "recorded now",
            lineterm=""))[:60])
        pytest.fail(f"{path} is stale: refresh it with `{REFRESH}` and review the SQL diff.\n"
                    f"{diff}", pytrace=False)
