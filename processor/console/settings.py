"""What one console serves (:class:`ConsoleSettings`), and the settings of a console
bound to an address (:func:`settings_for`). :mod:`processor.console.app` serves them."""

from __future__ import annotations

from dataclasses import dataclass

from processor.console.security import is_loopback
from watcher.store.db.urls import DatabaseURL

# How often the pages fetch their live part (milliseconds); the pages stop while hidden.
REFRESH_MS = 1500


@dataclass(frozen=True)
class ConsoleSettings:
    """What one console serves: the database (its URL is never shown), the table
    prefix, the token (``None``: loopback only), whether actions are off, and the
    ingest API's public base URL (``None``: unknown) for operators' completion URLs."""

    db_url: DatabaseURL
    table_prefix: str = ""
    token: str | None = None
    read_only: bool = False
    loopback_only: bool = True
    port: int = 0
    refresh_ms: int = REFRESH_MS
    api_url: str | None = None
    # The processors' --notify-url: a cancel here sends a partition that names no URL there.
    notify_default: str | None = None


def settings_for(db_url: DatabaseURL, table_prefix: str, *, host: str, port: int,
                 token: str | None, read_only: bool,
                 api_url: str | None = None,
                 notify_default: str | None = None) -> ConsoleSettings:
    """The settings of a console bound to ``host``:``port`` (loopback binds check the
    ``Host`` of each request)."""
    return ConsoleSettings(db_url=db_url, table_prefix=table_prefix, token=token,
                           read_only=read_only, loopback_only=is_loopback(host), port=port,
                           api_url=api_url, notify_default=notify_default)
