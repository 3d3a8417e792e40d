"""The ingest API (``processor api``): producers in any language create partitions, add
items, read, wait for, page, retry, cancel and delete them over HTTP, with the client
library's rules and errors.

:mod:`~processor.api.problems` is the one error shape, :mod:`~processor.api.upload`
reads and checks request bodies (NDJSON streamed to a spool), :mod:`~processor.api.routes`
is the Starlette app, and :mod:`~processor.api.server` serves it. The OpenAPI document,
``openapi.json`` here, is the contract; a test holds the routes to it.
"""
