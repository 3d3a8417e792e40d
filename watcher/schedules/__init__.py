"""Schedules: partitions created on a cron expression or a fixed interval.

What lives here: :mod:`~watcher.schedules.timing` (pure: a schedule's tick
times, its catch-up policy and the partition id of a tick),
:mod:`~watcher.schedules.records` (the values the store reads and writes) and
:mod:`~watcher.schedules.ticker` (the loop each processor runs: one indexed read
of due schedules per poll, and a transaction per tick). The SQL is in
:mod:`watcher.store.schedules`. Modules here import the store and the engine's
plain values, never :mod:`processor`.
"""
