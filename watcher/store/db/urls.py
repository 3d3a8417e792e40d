"""Database URLs: mapping plain URLs to the drivers statefeed uses, and redaction."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from urllib.parse import quote_plus, unquote

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from watcher.errors import ConfigError
from watcher.store.drivers import DRIVERS, PACKAGES
from watcher.store.drivers.mysql import CHARSET as MYSQL_CHARSET
from watcher.store.drivers.postgresql import pooler


def _schemes() -> dict[str, tuple[str, str]]:
    """Plain scheme -> (async driver URL scheme, sync driver URL scheme), gathered from
    the database packages (:mod:`watcher.store.drivers`), which say their own."""
    found: dict[str, tuple[str, str]] = {}
    for package in PACKAGES:
        found.update(importlib.import_module(f"watcher.store.drivers.{package}").SCHEMES)
    return found


_DRIVERS = _schemes()
SUPPORTED = "sqlite:///path, postgresql://..., mysql://..., mariadb://..., mssql://..."
MASK = "***"
# Query parameters shown as they are in messages; every other value is masked,
# since drivers take credentials in the query too (password, sslpassword, passwd,
# a key file's pass phrase, a token), and new ones appear with driver versions.
SHOWN_QUERY_KEYS = frozenset({
    "charset", "sslmode", "application_name", "connect_timeout", "tds_version",
    "target_session_attrs", "gssencmode", "timeout", "read_timeout", "write_timeout",
    "login_timeout", pooler.OPTION,
})
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _refuse_ambiguous_userinfo(raw: str) -> None:
    """Refuse a URL whose host part has more than one ``@``: an unencoded ``@`` in a
    password, which parsers split differently (part of the password would be taken
    for the host, printed and looked up in DNS). The message never echoes the URL.

    Raises:
        ConfigError: the authority holds more than one ``@``.
    """
    match = _SCHEME.match(raw)
    if match is None:
        return
    authority = raw[match.end():].split("/", 1)[0].split("?", 1)[0]
    if authority.count("@") > 1:
        raise ConfigError(
            "the database URL has more than one '@' before its host, so its password "
            "cannot be told apart from its host: percent-encode '@' in the user name or "
            "password as %40 (the URL is not shown here, as it holds a password)")


def url_secrets(url: URL) -> list[str]:
    """The secret values in ``url``: its password and every query value not in
    :data:`SHOWN_QUERY_KEYS`, raw and percent-decoded (what a message must never show)."""
    found = [str(url.password)] if url.password else []
    for key, value in url.query.items():
        if key.lower() in SHOWN_QUERY_KEYS:
            continue
        for one in (value,) if isinstance(value, str) else value:
            found.extend({one, unquote(one)})
    return sorted({secret for secret in found if secret}, key=len, reverse=True)


def render_redacted(url: URL) -> str:
    """``url`` as text with its password and secret query values replaced by ``***``."""
    base = url.set(query={}).render_as_string(hide_password=True)
    pairs = []
    for key, value in url.query.items():
        shown = key.lower() in SHOWN_QUERY_KEYS
        for one in (value,) if isinstance(value, str) else value:
            pairs.append(f"{quote_plus(key)}={quote_plus(one) if shown else MASK}")
    return f"{base}?{'&'.join(pairs)}" if pairs else base


def scrub(text: str, url: URL) -> str:
    """``text`` with every secret of ``url`` replaced by ``***``."""
    for secret in url_secrets(url):
        text = text.replace(secret, MASK)
    return text


@dataclass(frozen=True)
class DatabaseURL:
    """A validated database URL with its async (engine) and sync (migration) forms, and
    the URL as the user gave it (``given``), which messages name."""

    async_url: URL
    sync_url: URL
    given: URL | None = field(default=None, compare=False, repr=False)

    @property
    def dialect(self) -> str:
        """The SQLAlchemy dialect name, e.g. ``sqlite`` or ``postgresql``."""
        return self.async_url.get_backend_name()

    def redacted(self) -> str:
        """The URL as the user gave it (``sqlite:///x.db``, not the driver's
        ``sqlite+aiosqlite:///x.db``), with its password and secret query values
        replaced by ``***``."""
        return render_redacted(self.given if self.given is not None else self.async_url)

    def scrub(self, text: str) -> str:
        """``text`` (a driver's error, say) with every secret of this URL masked."""
        return scrub(text, self.async_url)

    def __repr__(self) -> str:
        return f"DatabaseURL({self.redacted()!r})"

    __str__ = redacted


def require_driver(url: DatabaseURL) -> None:
    """Check that the Python packages ``url``'s database needs are installed.

    Called where a connection is about to be made (engine, migrations), so that a plain
    install names the extra to add instead of failing deep inside SQLAlchemy.

    Raises:
        ConfigError: a driver package is missing; the message names the extra to install.
    """
    import importlib.util

    if url.dialect not in DRIVERS:
        return
    database = importlib.import_module(f"watcher.store.drivers.{DRIVERS[url.dialect][0]}")
    packages, extra = database.PACKAGES, database.EXTRA
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"{url.dialect}:// URLs need the {' and '.join(missing)} package"
            f"{'s' if len(missing) > 1 else ''}, which statefeed installs only on request: "
            f"pip install 'statefeed[{extra}]'")


def redact_url(raw: str) -> str:
    """Return ``raw`` with its password and secret query values hidden, or a
    placeholder if it cannot be parsed safely."""
    try:
        _refuse_ambiguous_userinfo(raw)
        return render_redacted(make_url(raw))
    except Exception:
        return "<unparseable database URL>"


def parse_database_url(raw: str) -> DatabaseURL:
    """Validate ``raw`` and map it to the drivers statefeed uses.

    ``postgresql://`` and ``postgres://`` map to psycopg 3; ``sqlite:///path``
    maps to aiosqlite for the engine and the standard library for migrations;
    ``mysql://`` and ``mariadb://`` map to aiomysql for the engine and PyMySQL
    for migrations (with ``charset=utf8mb4`` unless the URL sets one);
    ``mssql://`` maps to pymssql (run in a worker thread per connection for the
    engine, see :mod:`watcher.store.drivers.mssql.threaded`).

    Raises:
        ConfigError: the URL is malformed or names an unsupported database.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError("database URL is empty: pass one such as sqlite:///processor.db")
    _refuse_ambiguous_userinfo(raw.strip())
    try:
        url = make_url(raw.strip())
    except (ArgumentError, ValueError):
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
            f"database URL {render_redacted(url)!r} names no database; "
            f"add one, as in {backend}://user@host/dbname"
        )
    given = url
    if pooler.OPTION in url.query:
        if url.get_backend_name() != "postgresql":
            raise ConfigError(
                f"the database URL's {pooler.OPTION}= option is for PostgreSQL URLs "
                f"(PgBouncer in front of PostgreSQL); {render_redacted(url)!r} is not one")
        pooler.pooler_mode(url)
    if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
        url = url.update_query_dict({"charset": MYSQL_CHARSET})
    return DatabaseURL(url.set(drivername=async_scheme),
                       pooler.without_option(url).set(drivername=sync_scheme), given)
