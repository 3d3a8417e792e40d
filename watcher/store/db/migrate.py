"""Running the Alembic migrations that ship inside the package."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from alembic import command
from alembic.config import Config

from watcher.store.db.urls import DatabaseURL, parse_database_url, require_driver
from watcher.store.sql.schema import validate_table_prefix

MIGRATIONS = Path(__file__).parents[2] / "migrations"


def alembic_config(url: str | DatabaseURL, table_prefix: str = "") -> Config:
    """An Alembic config pointing at the packaged migrations.

    Raises:
        ConfigError: the URL or the prefix is invalid.
    """
    parsed = url if isinstance(url, DatabaseURL) else parse_database_url(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["db_url"] = parsed.sync_url.render_as_string(hide_password=False)
    config.attributes["table_prefix"] = validate_table_prefix(table_prefix)
    config.attributes["skip_logging"] = True
    return config


def upgrade(url: str | DatabaseURL, table_prefix: str = "", revision: str = "head") -> None:
    """Bring the database's statefeed tables up to ``revision``.

    Raises:
        ConfigError: the URL or the prefix is invalid, or the database's driver is not
            installed.
        sqlalchemy.exc.SQLAlchemyError: the database refused or could not be reached.
    """
    parsed = url if isinstance(url, DatabaseURL) else parse_database_url(url)
    require_driver(parsed)
    command.upgrade(alembic_config(parsed, table_prefix), revision)


def downgrade(url: str | DatabaseURL, table_prefix: str = "", revision: str = "base") -> None:
    """Remove the statefeed tables (down to ``revision``).

    Raises:
        ConfigError: the URL or the prefix is invalid, or the database's driver is not
            installed.
    """
    parsed = url if isinstance(url, DatabaseURL) else parse_database_url(url)
    require_driver(parsed)
    command.downgrade(alembic_config(parsed, table_prefix), revision)


def upgrade_sql(url: str | DatabaseURL, table_prefix: str = "") -> str:
    """The DDL that :func:`upgrade` would run, for the URL's dialect, without connecting.

    Raises:
        ConfigError: the URL or the prefix is invalid.
    """
    config = alembic_config(url, table_prefix)
    buffer = io.StringIO()
    config.output_buffer = buffer
    with contextlib.redirect_stdout(buffer):
        command.upgrade(config, "head", sql=True)
    return buffer.getvalue()


def current_revision(url: str | DatabaseURL, table_prefix: str = "") -> str | None:
    """The revision the database's statefeed tables are at; ``None`` when it has none
    (never migrated, under this prefix).

    Raises:
        ConfigError: the URL or the prefix is invalid, or the driver is not installed.
        sqlalchemy.exc.SQLAlchemyError: the database refused or could not be reached.
    """
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    parsed = url if isinstance(url, DatabaseURL) else parse_database_url(url)
    require_driver(parsed)
    prefix = validate_table_prefix(table_prefix)
    engine = create_engine(parsed.sync_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": f"{prefix}alembic_version"})
            return context.get_current_revision()
    finally:
        engine.dispose()
