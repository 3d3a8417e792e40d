"""What the console's pages show, as plain values: per-gate progress and partition rows
(:mod:`~processor.console.views.pages`), leases and parked items
(:mod:`~processor.console.views.leases_view`), a partition's timeline and ETA
(:mod:`~processor.console.views.timeline_view`), and how times and counts are worded
(:mod:`~processor.console.views.texts`).

Pure functions over records, at ``now`` by the database clock: no I/O, no HTML, tested
with tables of cases. May import :mod:`watcher` and the service's shared pure modules
(:mod:`processor.views`, :mod:`processor.wire`); never the console's pages or app above
it, which render what these return.
"""
