"""Schedules: partitions created on a cron expression or a fixed interval.

What lives here: :mod:`~watcher.schedules.timing` (pure: a schedule's tick times, its
catch-up policy and the partition id of a tick) and :mod:`~watcher.schedules.records`
(the values the store reads and writes). The SQL is in :mod:`watcher.store.schedules`,
and the loop each processor runs (one indexed read of due schedules per poll, and a
transaction per tick) is :mod:`watcher.schedule_ticker`. Modules here import only the
engine's plain values: the store imports them, not the other
way round.
"""
