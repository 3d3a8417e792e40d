"""The store's parts for operator verbs that span a partition's items (rewind, moving
partitions between a pipeline's versions) or write one (an operator's answer for an
item); the older verbs (retry, set-gate, cancel) are :mod:`watcher.store.operations`.

Part of :mod:`watcher.store`: may import the rest of the store, :mod:`watcher.rules`
(its decisions, :mod:`watcher.rules.operator`), :mod:`watcher.schedules` and the
engine's shared top-level modules; never flow, leasing or dispatch.
"""
