"""SQL Server: everything statefeed does differently on it, in one package.

- :mod:`.engine`: the engine's settings (``datetime2``, pymssql's timeouts);
- :mod:`.threaded`: pymssql (synchronous) under the asyncio engine, a worker thread
  per connection;
- :mod:`.driver`: the clock, the refusals, the one-statement ``OPENJSON`` result write.

No SQL Server runs in CI: what it receives is checked by compilation. This module
itself holds only what a URL needs, and registers the engine's driver by name
(pymssql is loaded only when a SQL Server engine is created).
Its modules may import what :mod:`watcher.store.drivers` may (its shared parts
included); never another database's package, nor anything above the store.
"""

from sqlalchemy.dialects import registry

# The engine's driver: pymssql in a worker thread per connection.
registry.register("mssql.pymssql_threaded", "watcher.store.drivers.mssql.threaded",
                  "MSDialectThreaded_pymssql")

# Plain URL scheme -> (the engine's driver scheme, the migrations' driver scheme).
# pymssql (FreeTDS, shipped in its wheels) is synchronous: the engine runs it in a
# worker thread per connection (:mod:`.threaded`).
SCHEMES: dict[str, tuple[str, str]] = {
    "mssql": ("mssql+pymssql_threaded", "mssql+pymssql"),
    "mssql+pymssql": ("mssql+pymssql_threaded", "mssql+pymssql"),
}
# The packages it needs beyond a plain install, and the extra that installs them.
PACKAGES: tuple[str, ...] = ("pymssql",)
EXTRA = "mssql"
