"""A seeded, randomized checker: generate work and faults from one seed, run them against
real ``processor run`` and ``processor api`` subprocesses, record the history, and check
the guarantees (docs/explanation/guarantees.md) against it.

- ``plan``: the seeded plan (partitions, items, and one timeline of actions: creates,
  operator verbs, faults), made by a table of weighted action kinds.
- ``handler``: the scripted handler app that follows each item's script and logs calls.
- ``actors``: the completer (completions and heartbeats by token), the operator verbs
  and the faults, each run at its time on the timeline.
- ``history``: what happened, as events serialisable to JSON lines.
- ``view``: a history read once for the checks (violations, trail steps, lookups).
- ``checker``: each guarantee as a pure function over a history, returning violations
  (``features``: those of reduce gates, notifications, schedules, outages, routes
  reloads and SIGTERM hand-overs).
- ``runner``: one plan against one database: processes, timeline, final state.
- ``shrink``: delta debugging over a plan's partitions and actions.
- ``__main__``: ``python -m tests.proof run|shrink|soak`` (docs/how-to/prove.md).
"""
