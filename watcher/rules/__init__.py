"""Pure decisions of the engine: what a partition does next, which partitions a watcher
takes, what an answer writes, how ids, durations and settings are checked, and the
arithmetic of priority, fairness, delays and rate-limit buckets.

Modules here take plain values and return plain values: no I/O, no clock reads, no
database. The bottom folder: they may import the engine's shared top-level modules
(values: :mod:`watcher.errors`, :mod:`watcher.protocol`, :mod:`watcher.records`,
:mod:`watcher.models`, :mod:`watcher.config`, :mod:`watcher.waits`, :mod:`watcher.text`)
and each other, and no other folder of the engine. Tests drive them with tables of cases.
"""
