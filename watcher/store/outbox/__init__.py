"""The notifications' outbox as the delivery loop and its readers use it
(:mod:`~watcher.store.outbox.deliveries`). The write every partition end makes is
:mod:`watcher.store.sql.outbox`.

Part of :mod:`watcher.store`: may import the rest of the store, :mod:`watcher.rules`,
:mod:`watcher.schedules` and the engine's shared top-level modules; never flow, leasing
or dispatch, nor the service's delivery loop (:mod:`processor.notify`), which imports it.
"""
