"""Pure decisions of the operator's verbs that span a partition's items (rewind). No I/O.

Part of :mod:`watcher.rules`, the bottom folder: may import the engine's shared
top-level modules (values such as :mod:`watcher.models`) and the other rules; never the
store or any folder above it (:mod:`watcher.store.operator` reads and writes).
"""
