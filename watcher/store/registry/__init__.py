"""The store's part for the registry of running processors: each processor's row (what it
serves, until when by the database clock) and the open partitions' places, which
together say where a partition waits for a processor that serves it.

Part of :mod:`watcher.store`: may import the rest of the store, :mod:`watcher.rules`
(the fleet's decisions, :mod:`watcher.rules.served`), :mod:`watcher.schedules` and the
engine's shared top-level modules; never flow, leasing or dispatch.
"""
