"""The notifications' outbox as the delivery loop and its readers use it
(:mod:`~watcher.store.outbox.deliveries`). The write every partition end makes is
:mod:`watcher.store.sql.outbox`."""
