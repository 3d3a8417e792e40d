"""The store's plumbing: creating the async engine and its transactions, parsing and
redacting database URLs, the database clock, bounded round trips, telling refused
values from outages, and running the migrations that ship in the package.

May import :mod:`watcher.store.drivers`, :mod:`watcher.errors` and the pure rules;
nothing above the store.
"""
