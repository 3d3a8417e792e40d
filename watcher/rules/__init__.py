"""Pure decisions of the engine: what a partition does next, which partitions a watcher
takes, what an answer writes, how ids, durations and settings are checked, and the
arithmetic of priority, fairness, delays and rate-limit buckets.

Modules here take plain values and return plain values: no I/O, no clock reads, no
database. They may import :mod:`watcher.errors`, :mod:`watcher.protocol`,
:mod:`watcher.text`, :mod:`watcher.records` and each other, and nothing else of
the engine. Tests drive them with tables of cases.
"""
