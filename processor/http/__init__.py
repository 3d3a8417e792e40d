"""The HTTP hop to the user's handler: its configuration, the transport, the per-item,
batch and reduce processors the engine calls, the endpoint that names them all, the
outage log lines, and the routes file (:mod:`.routes`) with the processor that routes each
call by pipeline, version and gate (:mod:`.routed`).

May import :mod:`watcher`, :mod:`handlers`, the service's shared top-level modules and the
folders below it (it uses :mod:`processor.wire` and :mod:`processor.observe`; notify, feed
and client are below it too); never the console, the API or the CLI.
"""
