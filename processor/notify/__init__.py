"""Notifications: a signed JSON event POSTed to a partition's ``notify`` URL when it ends.

The engine writes each end to an outbox in the transaction that ends the partition
(:mod:`watcher.store.sql.outbox`); the processor's delivery loop
(:mod:`processor.notify.deliverer`) sends it after, at least once, in order per
partition, with retries and backoff (:mod:`processor.notify.policy`), signed with
HMAC-SHA256 (:mod:`processor.notify.signing`). URLs are checked where a partition is
created and again before each send (:mod:`processor.notify.targets`).

May import :mod:`watcher`, :mod:`processor.wire`, :mod:`processor.observe` and the
service's shared top-level modules; never the feed, the client, the HTTP hop, the
console, the API or the CLI (the client, the console and the API import it).
"""
