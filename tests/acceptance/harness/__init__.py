"""A multi-process harness: real ``processor run`` subprocesses on real PostgreSQL,
driven against a recording handler served by uvicorn on loopback.

- ``handler``: the recording pass-counter handler and the calls it logs.
- ``checks``: pure checks over the call log and the final items.
- ``processes``: the ``processor`` command as a subprocess (run, stop, kill -9, pause).
- ``database``: database URLs and the processors' PostgreSQL sessions.
- ``faults``: outages and pauses inflicted on purpose.
- ``cluster``: processors, a handler and an empty table prefix of
  its own, together.
"""
