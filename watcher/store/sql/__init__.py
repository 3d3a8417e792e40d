"""The statements the store sends, built once per table prefix: the shared hot reads and
guarded writes, the lease cycle's statements and the close a drained gate tries, with
the table objects (``schema``) they are built on.

May import the engine's shared top-level modules (:mod:`watcher.models`,
:mod:`watcher.records`, errors, waits, ...), :mod:`watcher.store.db`,
:mod:`watcher.store.drivers` and the pure rules; never the store's entity modules, nor
anything above the store.
"""
