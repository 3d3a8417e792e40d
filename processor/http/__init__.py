"""The HTTP hop to the user's handler: its configuration, the transport, the per-item,
batch and reduce processors the engine calls, the endpoint that names them all, and
the outage log lines.

May import :mod:`processor.wire.contract`, :mod:`processor.observe` and :mod:`watcher`; never
the CLI, the console or the API.
"""
