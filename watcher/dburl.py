"""Database URLs: mapping plain URLs to the drivers statefeed uses, and redaction."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from watcher.errors import ConfigError

# Plain scheme -> (async driver URL scheme, sync driver URL scheme).
_DRIVERS: dict[str, tuple[str, str]] = {
    "postgresql": ("postgresql+psycopg", "postgresql+psycopg"),
    "postgres": ("postgresql+psycopg", "postgresql+psycopg"),
    "postgresql+psycopg": ("postgresql+psycopg", "postgresql+psycopg"),
    "sqlite": ("sqlite+aiosqlite", "sqlite"),
    "sqlite+aiosqlite": ("sqlite+aiosqlite", "sqlite"),
    # MySQL and MariaDB: aiomysql (pure Python, on PyMySQL) runs the engine, PyMySQL the
    # migrations. mariadb:// selects SQLAlchemy's MariaDB dialect, which insists on one.
    "mysql": ("mysql+aiomysql", "mysql+pymysql"),
    "mysql+aiomysql": ("mysql+aiomysql", "mysql+pymysql"),
    "mysql+pymysql": ("mysql+aiomysql", "mysql+pymysql"),
    "mariadb": ("mariadb+aiomysql", "mariadb+pymysql"),
    "mariadb+aiomysql": ("mariadb+aiomysql", "mariadb+pymysql"),
    "mariadb+pymysql": ("mariadb+aiomysql", "mariadb+pymysql"),
    # SQL Server: pymssql (FreeTDS, shipped in its wheels). pymssql is synchronous: the
    # engine runs it in a worker thread per connection (watcher.threaded_driver).
    "mssql": ("mssql+pymssql_threaded", "mssql+pymssql"),
    "mssql+pymssql": ("mssql+pymssql_threaded", "mssql+pymssql"),
}
SUPPORTED = "sqlite:///path, postgresql://..., mysql://..., mariadb://..., mssql://..."
# The character set MySQL/MariaDB connections use unless the URL names one: every
# Unicode character, as on the other databases.
MYSQL_CHARSET = "utf8mb4"


@dataclass(frozen=True)
class DatabaseURL:
    """A validated database URL with its async (engine) and sync (migration) forms."""

    async_url: URL
    sync_url: URL

    @property
    def dialect(self) -> str:
        """The SQLAlchemy dialect name, e.g. ``sqlite`` or ``postgresql``."""
        return self.async_url.get_backend_name()

    def redacted(self) -> str:
        """The URL as text with any password replaced by ``***``."""
        return self.async_url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"DatabaseURL({self.redacted()!r})"

    __str__ = redacted


def redact_url(raw: str) -> str:
    """Return ``raw`` with a password hidden, or a placeholder if it cannot be parsed."""
    try:
        return make_url(raw).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def parse_database_url(raw: str) -> DatabaseURL:
    """Validate ``raw`` and map it to the drivers statefeed uses.

    ``postgresql://`` and ``postgres://`` map to psycopg 3; ``sqlite:///path``
    maps to aiosqlite for the engine and the standard library for migrations;
    ``mysql://`` and ``mariadb://`` map to aiomysql for the engine and PyMySQL
    for migrations (with ``charset=utf8mb4`` unless the URL sets one);
    ``mssql://`` maps to pymssql (run in a worker thread per connection for the
    engine, see :mod:`watcher.threaded_driver`).

    Raises:
        ConfigError: the URL is malformed or names an unsupported database.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError("database URL is empty: pass one such as sqlite:///processor.db")
    try:
        url = make_url(raw.strip())
    except ArgumentError:
        raise ConfigError(
            f"database URL {redact_url(raw)!r} is malformed: expected a form such as "
            "sqlite:///processor.db or postgresql://user:password@host:5432/dbname"
        ) from None
    drivers = _DRIVERS.get(url.drivername)
    if drivers is None:
        raise ConfigError(
            f"database URL scheme {url.drivername!r} is not supported; use one of: {SUPPORTED}"
        )
    async_scheme, sync_scheme = drivers
    if async_scheme.startswith("sqlite") and url.database in (None, "", ":memory:"):
        raise ConfigError(
            "an in-memory SQLite database cannot be shared between the engine and its clients; "
            "give a file path such as sqlite:///processor.db"
        )
    if not async_scheme.startswith("sqlite") and not url.database:
        backend = url.get_backend_name()
        raise ConfigError(
            f"database URL {url.render_as_string(hide_password=True)!r} names no database; "
            f"add one, as in {backend}://user@host/dbname"
        )
    if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
        url = url.update_query_dict({"charset": MYSQL_CHARSET})
    return DatabaseURL(url.set(drivername=async_scheme), url.set(drivername=sync_scheme))
