"""The ingest API's routes over one :class:`~processor.client.async_client.AsyncClient`.

=======  =====================================  =======================================
GET      ``/v1/partitions``                     a page of partitions (``?status=&prefix=``)
PUT      ``/v1/partitions/{id}``                create it with its items (JSON or NDJSON)
GET      ``/v1/partitions/{id}``                read it: status, gate, counts, result
DELETE   ``/v1/partitions/{id}``                delete it and its items (``?force=true``)
POST     ``/v1/partitions/{id}/items``          add items (JSON or NDJSON)
GET      ``/v1/partitions/{id}/items``          a page of its items
GET      ``/v1/partitions/{id}/wait``           long poll until it finishes (``?timeout=``)
GET      ``/v1/partitions/{id}/events``         its live feed (Server-Sent Events)
POST     ``/v1/partitions/{id}/retry``          run its failed items again
POST     ``/v1/partitions/{id}/rewind``         move it back to a gate (JSON body)
POST     ``/v1/partitions/{id}/cancel``         stop it
POST     ``/v1/partitions/{id}/pause``          pause it (durably, until resumed)
POST     ``/v1/partitions/{id}/resume``         lift its pause
(flow)   ``/v1/keys``, ``/v1/fleet``            keys' limits and pauses, the fleet pause
GET      ``/v1/notifications``                  notification events (``?state=&partition=``)
POST     ``/v1/notifications/redeliver``        send dead events again (``{"seqs": [..]}``)
GET      ``/v1/openapi.json``                   the OpenAPI 3.1 document
GET      ``/healthz``                           liveness (no database read)
=======  =====================================  =======================================

Ids are path segments, percent-encoded: ``/v1/partitions/inbox%2F2026/items`` is
partition ``inbox/2026``. Routing reads the raw path, so any id has an address
(:mod:`processor.api.dispatch`); the flow routes are :mod:`processor.api.flow_routes`'s,
the notification routes :mod:`processor.api.notification_routes`'s.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib.resources import files
from typing import Any
from urllib.parse import quote

from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from starlette.requests import Request
from starlette.responses import Response

from processor.api.bodies import media_type, read_whole, stream_into
from processor.api.create_settings import (
    query_settings,
    settings_from,
    start_time,
    with_query_fields,
)
from processor.api.dispatch import (
    KEY,
    PARTITION,
    STATIC_METHODS,
    STATIC_ROUTES,
    Handler,
    Router,
    answer,
)
from processor.api.feed_route import events_route
from processor.api.flow_routes import FLOW_ROUTES
from processor.api.notification_routes import NOTIFICATION_ROUTES
from processor.api.problems import bad_request, from_statefeed, unsupported_media
from processor.api.upload import (
    ADD_FIELDS,
    CREATE_FIELDS,
    JSON_TYPES,
    Limits,
    NdjsonItems,
    RequestDigest,
    Spool,
    json_document,
    json_items,
)
from processor.api.views import (
    DEFAULT_WAIT_SECONDS,
    MAX_WAIT_SECONDS,
    flag,
    item_view,
    only,
    page_limit,
    partition_view,
    seconds,
    timestamp,
    whole_number,
)
from processor.client.async_client import AsyncClient
from processor.client.checks import MAX_PAGE
from processor.feed.hub import FeedHub, FeedSettings
from processor.observe.tracing import traced_settings
from processor.views import retry_row, rewind_row
from watcher.errors import DuplicateItemError
from watcher.models import MAX_GATE
from watcher.records import NewItem, PartitionInfo
from watcher.reports import WaitSummary
from watcher.store.db.urls import DatabaseURL

log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY = 255
REWIND_FIELDS = frozenset({"gate", "failed_only", "items", "version"})
OPENAPI = files("processor.api").joinpath("openapi.json")
__all__ = ["KEY", "PARTITION", "ROUTES", "STATIC_METHODS", "STATIC_ROUTES", "ApiSettings",
           "Dispatch", "IngestApi"]


@dataclass(frozen=True)
class ApiSettings:
    """The database the API writes, its limits, and who may call it (a bearer ``token``;
    ``loopback_only``: requests must name a loopback host)."""

    db_url: DatabaseURL
    table_prefix: str = ""
    limits: Limits = field(default_factory=Limits)
    token: str | None = None
    loopback_only: bool = True
    feed: FeedSettings = field(default_factory=FeedSettings)
    notify_default: str | None = None  # where a cancel sends one that names no URL


class IngestApi:
    """The routes, and the client they share (opened by the app's lifespan when not
    given)."""

    def __init__(self, settings: ApiSettings, client: AsyncClient | None = None,
                 feed: FeedHub | None = None) -> None:
        self.settings = settings
        self.limits = settings.limits
        self._client = client
        self.feed = feed or FeedHub(settings.feed)

    def openapi(self) -> bytes:
        """The OpenAPI document, as checked in."""
        return OPENAPI.read_bytes()

    @property
    def client(self) -> AsyncClient:
        assert self._client is not None, "the API's lifespan has not started"
        return self._client

    @contextlib.asynccontextmanager
    async def lifespan(self, _: object) -> AsyncIterator[None]:
        """Open the client for the app's life (unless one was given)."""
        if self._client is not None:
            try:
                yield
            finally:
                await self.feed.close()
            return
        self._client = AsyncClient(self.settings.db_url, self.settings.table_prefix,
                                   max_item_bytes=self.limits.max_item_bytes,
                                   notify_default=self.settings.notify_default)
        try:
            yield
        finally:
            await self.feed.close()
            await self._client.close()
            self._client = None

    # ------------------------------------------------------------------ create and add

    async def create(self, request: Request, partition_id: str) -> Response:
        key = request.headers.get("idempotency-key")
        if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY):
            raise bad_request(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} "
                              "characters", field="Idempotency-Key")
        media = media_type(request)
        digest = RequestDigest(key, media)
        spool = Spool()
        try:
            if media in JSON_TYPES:
                body = await read_whole(request, self.limits.max_body_bytes)
                digest.update(body)
                document = with_query_fields(json_document(body, CREATE_FIELDS),
                                             dict(request.query_params))
                settings = settings_from(partition_id, document.get("reduce_gates"),
                                         document.get("on_item_failure"),
                                         document.get("priority"), document.get("key"),
                                         document.get("quorum"), document.get("notify"),
                                         document.get("pipeline"),
                                         document.get("pipeline_version"))
                start_at = start_time(document.get("start_at"))
                for item in json_items(partition_id, document.get("items"), self.limits,
                                       allow_empty=True):
                    spool.add(item)
            else:
                settings = query_settings(partition_id, dict(request.query_params))
                start_at = start_time(request.query_params.get("start_at"))
                lines = NdjsonItems(partition_id, self.limits, spool, digest)
                await stream_into(request, lines)
            # The trace context is not part of the digest: a retry is the same request.
            created = await self._insert(partition_id, spool,
                                         traced_settings(settings, request.headers),
                                         digest.settle(settings, start_at), start_at)
        finally:
            spool.close()
        view = {"id": partition_id, "items": spool.count, "first_gate": spool.first_gate or 0,
                "reduce_gates": sorted(settings.reduce_gates),
                "on_item_failure": "continue" if settings.continue_on_failure else "fail",
                "key": settings.key or None, "priority": settings.priority,
                "quorum": {str(gate): k for gate, k in settings.quorum} or None,
                "notify": settings.notify, "start_at": timestamp(start_at),
                "pipeline": settings.pipeline, "pipeline_version": settings.pipeline_version}
        if created:
            log.info("action=api_partition_created partition=%r items=%d", partition_id,
                     spool.count)
        return answer(201, view, ("location", f"/v1/partitions/{quote(partition_id, safe='')}"),
                      ("idempotent-replayed", "false" if created else "true"))

    async def _insert(self, partition_id: str, spool: Spool, settings: Any, digest: str,
                      start_at: datetime | None) -> bool:
        store = self.client.store
        try:
            return await store.partition_create_batches(
                partition_id, spool.batches(), spool.first_gate or 0, settings,
                request_digest=digest, start_at=start_at)
        except IntegrityError:
            raise from_statefeed(DuplicateItemError(partition_id, spool.repeated_ids(),
                                                    stored=False), field="items") from None
        except SQLAlchemyError as error:
            raise from_statefeed(self.client.database_error(error)) from None

    async def add(self, request: Request, partition_id: str) -> Response:
        only(request.query_params, frozenset())
        media = media_type(request)
        items: list[NewItem]
        if media in JSON_TYPES:
            body = await read_whole(request, self.limits.max_body_bytes)
            document = json_document(body, ADD_FIELDS)
            if "items" not in document:
                raise bad_request("the body needs 'items', an array of new items",
                                  field="items")
            items = json_items(partition_id, document["items"], self.limits, allow_empty=False)
        else:
            spool = Spool()
            try:
                await stream_into(request, NdjsonItems(partition_id, self.limits, spool,
                                                       whole=True))
                items = [item for batch in spool.batches() for item in batch]
            finally:
                spool.close()
        reopened = await self.client.add_items(partition_id, items)
        log.info("action=api_items_added partition=%r items=%d reopened=%s", partition_id,
                 len(items), reopened)
        return answer(200, {"id": partition_id, "added": len(items), "reopened": reopened})

    # ------------------------------------------------------------------ reads

    async def list_partitions(self, request: Request, _: str) -> Response:
        query = request.query_params
        only(query, frozenset({"status", "limit", "after", "prefix"}))
        limit = page_limit(query, MAX_PAGE)
        page = await self.client.partitions(query.get("status"), limit,
                                            after=query.get("after"),
                                            id_prefix=query.get("prefix"))
        parked = await self._parked(page)
        return answer(200, {"partitions": [partition_view(info, parked.get(info.id))
                                           for info in page],
                            "next_cursor": page.next_cursor})

    async def read(self, request: Request, partition_id: str) -> Response:
        only(request.query_params, frozenset())
        info = await self.client.partition(partition_id)
        return answer(200, partition_view(info, (await self._parked([info])).get(info.id)))

    async def _parked(self, infos: Sequence[PartitionInfo]) -> dict[str, WaitSummary]:
        """The parked items of those of ``infos`` that have some (one read, or none)."""
        ids = [info.id for info in infos if info.counts.get("waiting")]
        return await self.client.waits_summary(ids) if ids else {}

    async def wait(self, request: Request, partition_id: str) -> Response:
        only(request.query_params, frozenset({"timeout"}))
        timeout = seconds(request.query_params, "timeout", DEFAULT_WAIT_SECONDS,
                          high=MAX_WAIT_SECONDS)
        try:
            info = await self.client.wait(partition_id, timeout)
        except TimeoutError:
            info = await self.client.partition(partition_id)
        view = partition_view(info, (await self._parked([info])).get(info.id))
        return answer(200 if view["finished"] else 202, view)

    async def items(self, request: Request, partition_id: str) -> Response:
        query = request.query_params
        only(query, frozenset({"status", "gate", "after", "limit", "data"}))
        with_data = flag(query, "data", True)
        page = await self.client.items(
            partition_id, status=query.get("status"),
            gate=whole_number(query, "gate", None, low=0, high=MAX_GATE),
            limit=page_limit(query, MAX_PAGE),
            after=query.get("after"), with_data=with_data)
        return answer(200, {"items": [item_view(item, with_data=with_data) for item in page],
                            "next_cursor": page.next_cursor})

    async def events(self, request: Request, partition_id: str) -> Response:
        return await events_route(self.feed, self.client, request, partition_id)

    # ------------------------------------------------------------------ operations

    async def retry(self, request: Request, partition_id: str) -> Response:
        only(request.query_params, frozenset())
        report = await self.client.retry_failed(partition_id)
        log.info("action=api_retry partition=%r items_reset=%d", partition_id,
                 report.items_reset)
        return answer(200, retry_row(report))

    async def rewind(self, request: Request, partition_id: str) -> Response:
        only(request.query_params, frozenset())
        if media_type(request) not in JSON_TYPES:
            raise unsupported_media(request.headers.get("content-type"),
                                    example='{"gate": 1}')
        document = json_document(await read_whole(request, self.limits.max_body_bytes),
                                 REWIND_FIELDS)
        gate, failed_only = document.get("gate"), document.get("failed_only", False)
        items, version = document.get("items"), document.get("version")
        if type(gate) is not int or not 0 <= gate <= MAX_GATE:
            raise bad_request(f"'gate' must be a whole number from 0 to {MAX_GATE}",
                              field="gate")
        if type(failed_only) is not bool:
            raise bad_request("'failed_only' must be true or false", field="failed_only")
        if items is not None and (not isinstance(items, list)
                                  or not all(isinstance(one, str) for one in items)):
            raise bad_request("'items' must be a list of item ids (strings)", field="items")
        if version is not None and type(version) is not int:
            raise bad_request("'version' must be a whole number (the partition's version "
                              "as read)", field="version")
        report = await self.client.rewind(partition_id, gate, failed_only=failed_only,
                                          items=items, version=version)
        log.info("action=api_rewind partition=%r gate=%d items_reset=%d items_removed=%d",
                 partition_id, gate, report.items_reset, report.items_removed)
        return answer(200, rewind_row(report))

    async def pause(self, request: Request, partition_id: str) -> Response:
        return await self._pause(request, partition_id, pausing=True)

    async def resume(self, request: Request, partition_id: str) -> Response:
        return await self._pause(request, partition_id, pausing=False)

    async def _pause(self, request: Request, partition_id: str, *, pausing: bool) -> Response:
        only(request.query_params, frozenset())
        verb = self.client.pause if pausing else self.client.resume
        changed = await verb(partition_id)
        info = await self.client.partition(partition_id)
        log.info("action=api_%s partition=%r changed=%s", verb.__name__, partition_id, changed)
        return answer(200, {"id": partition_id, "paused" if pausing else "resumed": changed,
                            "status": info.status, "paused_at": timestamp(info.paused_at)})

    async def cancel(self, request: Request, partition_id: str) -> Response:
        only(request.query_params, frozenset())
        cancelled = await self.client.cancel(partition_id)
        info = await self.client.partition(partition_id)
        log.info("action=api_cancel partition=%r cancelled=%s", partition_id, cancelled)
        return answer(200, {"id": partition_id, "cancelled": cancelled, "status": info.status})

    async def delete(self, request: Request, partition_id: str) -> Response:
        only(request.query_params, frozenset({"force"}))
        deleted = await self.client.delete_partition(
            partition_id, force=flag(request.query_params, "force", False))
        log.info("action=api_delete partition=%r items=%d", partition_id, deleted)
        return answer(200, {"id": partition_id, "deleted": True, "items_deleted": deleted})


# --------------------------------------------------------------------------- routing

ROUTES: dict[tuple[str, ...], dict[str, Handler]] = {
    ("v1", "partitions"): {"GET": IngestApi.list_partitions},
    ("v1", "partitions", PARTITION): {
        "PUT": IngestApi.create, "GET": IngestApi.read, "DELETE": IngestApi.delete},
    ("v1", "partitions", PARTITION, "items"): {"POST": IngestApi.add, "GET": IngestApi.items},
    ("v1", "partitions", PARTITION, "wait"): {"GET": IngestApi.wait},
    ("v1", "partitions", PARTITION, "events"): {"GET": IngestApi.events},
    ("v1", "partitions", PARTITION, "retry"): {"POST": IngestApi.retry},
    ("v1", "partitions", PARTITION, "rewind"): {"POST": IngestApi.rewind},
    ("v1", "partitions", PARTITION, "cancel"): {"POST": IngestApi.cancel},
    ("v1", "partitions", PARTITION, "pause"): {"POST": IngestApi.pause},
    ("v1", "partitions", PARTITION, "resume"): {"POST": IngestApi.resume},
    **FLOW_ROUTES,
    **NOTIFICATION_ROUTES,
}


class Dispatch(Router):
    """The ASGI app of the API's routes over ``api``."""

    def __init__(self, api: IngestApi) -> None:
        super().__init__(api, ROUTES)
