"""MariaDB and MySQL: everything statefeed does differently on them, in one package.

- :mod:`.engine`: the engine's settings (READ COMMITTED, statement and lock timeouts, keepalives);
- :mod:`.driver`: the clock, the refusals, the one-statement ``JSON_TABLE`` result write;
- :mod:`.direct`: the hot statements on a few aiomysql connections of the driver's own;
- :mod:`.packet`: data as base64, and statements measured against ``max_allowed_packet``;
- :mod:`.columns`: the column types the models and migrations use here.

This module itself holds only what a URL needs (it imports nothing).
Its modules may import what :mod:`watcher.store.drivers` may (its shared parts
included); never another database's package, nor anything above the store.
"""

# Plain URL scheme -> (the engine's driver scheme, the migrations' driver scheme).
# aiomysql (pure Python, on PyMySQL) runs the engine, PyMySQL the migrations.
# mariadb:// selects SQLAlchemy's MariaDB dialect, which insists on one.
SCHEMES: dict[str, tuple[str, str]] = {
    "mysql": ("mysql+aiomysql", "mysql+pymysql"),
    "mysql+aiomysql": ("mysql+aiomysql", "mysql+pymysql"),
    "mysql+pymysql": ("mysql+aiomysql", "mysql+pymysql"),
    "mariadb": ("mariadb+aiomysql", "mariadb+pymysql"),
    "mariadb+aiomysql": ("mariadb+aiomysql", "mariadb+pymysql"),
    "mariadb+pymysql": ("mariadb+aiomysql", "mariadb+pymysql"),
}
# The packages it needs beyond a plain install, and the extra that installs them.
PACKAGES: tuple[str, ...] = ("aiomysql", "pymysql")
EXTRA = "mysql"
# The character set connections use unless the URL names one: every Unicode
# character, as on the other databases.
CHARSET = "utf8mb4"
