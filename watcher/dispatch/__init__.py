"""Dispatch of one leased partition: the supervisor, the shared pool of call slots, the
reads of ready items and the items in hand, calling the processor per item or per batch,
the group-committing writer, the moves between gates and the reduce of a gate.

The top folder of the engine: may import :mod:`watcher.store`, :mod:`watcher.rules`,
:mod:`watcher.schedules`, :mod:`watcher.flow`, :mod:`watcher.leasing` and the shared
top-level modules; never the service (:mod:`processor`): what it needs from there,
such as a tracer, is passed in.
"""
