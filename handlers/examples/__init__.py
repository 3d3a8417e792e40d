"""Example handlers: ``echo`` (the smallest handler), ``resumes`` (a two-gate pipeline,
with ``samples``, its made-up data) and ``approval`` (a wait for a person's answer).

May import the public :mod:`handlers` and each other only, as a user's handler would;
never :mod:`watcher` or :mod:`processor` (``processor demo`` imports them, not the
other way round).
"""
