"""The HTTP hop to the user's handler: its configuration, the transport, the per-item,
batch and reduce processors the engine calls, the endpoint that names them all, the
outage log lines, and the routes file (:mod:`.routes`) with the processor that routes each
call by pipeline, version and gate (:mod:`.routed`).

May import :mod:`processor.wire.contract`, :mod:`processor.observe` and :mod:`watcher`; never
the CLI, the console or the API.
"""
