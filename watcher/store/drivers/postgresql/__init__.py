"""PostgreSQL: everything statefeed does differently on it, in one package.

- :mod:`.engine`: the engine's settings (timeouts, keepalives, stuck transactions, plans);
- :mod:`.driver`: the clock, the refusals, the one-statement result write, LISTEN/NOTIFY;
- :mod:`.direct`: the hot statements on a few psycopg connections of the driver's own.

This module itself holds only what a URL needs (it imports nothing).
Its modules may import what :mod:`watcher.store.drivers` may (its shared parts
included); never another database's package, nor anything above the store.
"""

# Plain URL scheme -> (the engine's driver scheme, the migrations' driver scheme).
SCHEMES: dict[str, tuple[str, str]] = {
    "postgresql": ("postgresql+psycopg", "postgresql+psycopg"),
    "postgres": ("postgresql+psycopg", "postgresql+psycopg"),
    "postgresql+psycopg": ("postgresql+psycopg", "postgresql+psycopg"),
}
# The packages it needs beyond a plain install (psycopg comes with one), and their extra.
PACKAGES: tuple[str, ...] = ()
EXTRA = ""
