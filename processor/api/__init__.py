"""The ingest API (``processor api``): producers in any language create partitions, add
items, list, read, wait for, page, retry, pause, cancel and delete them, steer the
flow (keys' limits and pauses, the pause of everything), and list notification events
and send dead ones again over HTTP, with the client library's rules and errors.

:mod:`~processor.api.problems` is the one error shape, :mod:`~processor.api.upload`
checks items and settings (NDJSON line by line into a spool; the CLI's ``create`` uses
it too), :mod:`~processor.api.bodies` reads request bodies into it,
:mod:`~processor.api.views` shapes the answers, :mod:`~processor.api.routes` answers
the partitions' requests (their live feed :mod:`~processor.api.feed_route` checks, and
:mod:`processor.feed` streams), :mod:`~processor.api.flow_routes` the flow
controls' and :mod:`~processor.api.notification_routes` the notifications';
:mod:`~processor.api.dispatch` routes them, and :mod:`~processor.api.server` guards
and serves them. The OpenAPI document, ``openapi.json`` here, is the contract; a test
holds the routes to it.

May import :mod:`watcher`, :mod:`handlers`, the service's shared top-level modules and
the folders below it (:mod:`processor.wire`, :mod:`~processor.observe`,
:mod:`~processor.notify`, :mod:`~processor.feed`, :mod:`~processor.client`,
:mod:`~processor.http`, :mod:`~processor.console`); never :mod:`processor.cli`.
"""
