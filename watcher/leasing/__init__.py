"""Leases: the keeper that takes free partitions, steals toward a fair share, renews and
releases, the lease a watcher holds on one partition (its version, gate, timeline
and the progress it hands over), a holder's close sent with its last results, the
processor's row saying what it serves, and the listener that wakes holders when
clients write their partitions.

May import :mod:`watcher.store`, :mod:`watcher.rules`, :mod:`watcher.schedules`,
:mod:`watcher.flow` and the shared top-level modules (errors, hooks, config); never
:mod:`watcher.dispatch`.
"""
