"""Alembic environment: resolves the database URL and table prefix, then migrates."""

from __future__ import annotations

import logging.config
import os

from alembic import context
from sqlalchemy import Engine, create_engine, pool

from watcher.store.db.urls import parse_database_url
from watcher.store.sql.schema import validate_table_prefix

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging"):
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

x_args = context.get_x_argument(as_dictionary=True)
raw_url = (
    config.attributes.get("db_url")
    or x_args.get("db_url")
    or os.environ.get("PROCESSOR_DB_URL")
    or config.get_main_option("sqlalchemy.url")
    or "sqlite:///processor.db"
)
prefix = validate_table_prefix(str(
    config.attributes.get("table_prefix")
    if config.attributes.get("table_prefix") is not None
    else x_args.get("table_prefix", os.environ.get("PROCESSOR_TABLE_PREFIX", ""))
))
database_url = parse_database_url(raw_url)
# The migration scripts read the prefix from here.
config.attributes["table_prefix"] = prefix
version_table = f"{prefix}alembic_version"


def run_migrations_offline() -> None:
    """Print the DDL for the URL's dialect without connecting."""
    context.configure(
        url=database_url.sync_url,
        literal_binds=True,
        version_table=version_table,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def _use_write_ahead_log(engine: Engine) -> None:
    # WAL is a property of the file. Switching to it takes an exclusive lock that
    # SQLite refuses at once (no busy wait) while another connection writes, so it
    # happens here, before any processor or client opens the database; their
    # connections then find WAL already set.
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")


def run_migrations_online() -> None:
    """Connect and migrate."""
    engine = create_engine(database_url.sync_url, poolclass=pool.NullPool)
    if database_url.dialect == "sqlite":
        _use_write_ahead_log(engine)
    with engine.connect() as connection:
        context.configure(connection=connection, version_table=version_table)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
