"""The live feed: a partition's gate moves, item counts, result and end as they happen,
served as Server-Sent Events by the ingest API (``GET /v1/partitions/{id}/events``) and
the console (``/live/partition/events``), followed from Python by the clients'
``follow`` and in a terminal by ``processor watch``.

:mod:`~processor.feed.events` shapes the events and their ids (pure),
:mod:`~processor.feed.hub` polls the database once for every follower of every
partition and fans out, :mod:`~processor.feed.delivery` paces one follower's events,
:mod:`~processor.feed.stream` sends them as an SSE answer, and
:mod:`~processor.feed.follow` reads a stream for ``processor watch`` (reconnecting) and
:mod:`~processor.feed.view` draws it.

May import :mod:`watcher`, :mod:`processor.wire`, :mod:`processor.observe`,
:mod:`processor.notify` and the service's shared top-level modules; never the client,
the HTTP hop, the console, the API or the CLI
(they import the feed: the client's ``follow`` runs a hub of its own). The hub reads
through a :class:`~processor.feed.hub.FeedSource`, which a client is.
"""
