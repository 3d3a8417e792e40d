"""SQLite: everything statefeed does differently on it, in one package.

- :mod:`.engine`: the engine's settings (WAL, ``BEGIN IMMEDIATE``, the busy timeout, FULL sync);
- :mod:`.driver`: the clock as text, the refusals, the one-``executemany`` result write;
- :mod:`.direct`: the hot path on the event loop's thread, and what its commits promise.

This module itself holds only what a URL needs (it imports nothing).
Its modules may import what :mod:`watcher.store.drivers` may (its shared parts
included); never another database's package, nor anything above the store.
"""

# Plain URL scheme -> (the engine's driver scheme, the migrations' driver scheme).
SCHEMES: dict[str, tuple[str, str]] = {
    "sqlite": ("sqlite+aiosqlite", "sqlite"),
    "sqlite+aiosqlite": ("sqlite+aiosqlite", "sqlite"),
}
# The packages it needs beyond a plain install (aiosqlite comes with one), and their extra.
PACKAGES: tuple[str, ...] = ()
EXTRA = ""
