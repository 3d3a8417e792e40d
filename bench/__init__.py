"""statefeed's benchmark suite: statefeed against PGQueuer and bare HTTP clients, side by side,
on PostgreSQL, SQLite and MariaDB.

Run it with ``.venv/bin/python -m bench`` (``--help`` for the options); see
:mod:`bench.__main__`.
"""
