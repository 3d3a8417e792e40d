"""The store's plumbing: creating the async engine and its transactions, parsing and
redacting database URLs, the database clock, bounded round trips, telling refused
values from outages, and running the migrations that ship in the package.

May import the rest of the store (:mod:`watcher.store.drivers`, the schema in
:mod:`watcher.store.sql`), the pure rules and the engine's shared top-level modules
(errors, config); nothing above the store.
"""
