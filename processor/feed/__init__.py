"""The live feed: ``GET /v1/partitions/{id}/events`` on the ingest API, a partition's gate
moves, item counts, result and end as Server-Sent Events, and ``processor watch``.

:mod:`~processor.feed.events` shapes the events and their ids (pure),
:mod:`~processor.feed.hub` polls the database once for every follower of every
partition and fans out, :mod:`~processor.feed.stream` answers the route, and
:mod:`~processor.feed.follow` reads a stream for ``processor watch``, reconnecting.
"""
