"""Reading a request's items: a JSON body whole, or NDJSON line by line into a spool.

An NDJSON create may be far bigger than memory should hold. Each line is checked
as it arrives (the item's shape, then the client library's rules) and written to
a :class:`Spool`, a temporary file kept in memory up to a few MiB; nothing
reaches the database until the stream has ended whole. The digest of the
request (its idempotency key, settings and bytes) is taken on the way.

Every check raises :class:`~processor.api.problems.ApiError` naming the field or
line at fault. No I/O but the spool's file.
"""

from __future__ import annotations

import hashlib
import json
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from processor.api.client_rate import DEFAULT_COMPLETIONS_PER_MINUTE
from processor.api.problems import ApiError, bad_request, from_statefeed, too_large
from processor.client.checks import check_item, check_items
from processor.wire.contract import parse_new_item
from processor.wire.values import MalformedResponseError, RepeatedKeyError, decode_json
from watcher.config import DEFAULT_MAX_ITEM_BYTES
from watcher.errors import InvalidInputError
from watcher.records import DEFAULT_PIPELINE, NewItem, PartitionSettings

MIB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 64 * MIB
DEFAULT_MAX_UPLOAD_BYTES = 4096 * MIB
# What a spool keeps in memory before it moves to a temporary file.
SPOOL_MEMORY_BYTES = 4 * MIB
# Items per INSERT batch read back from a spool.
SPOOL_BATCH = 1000
# A line holds one item: its data (as JSON, or base64 at 4/3 of its size) and its id.
LINE_OVERHEAD_BYTES = 64 * 1024
JSON_TYPES = frozenset({"application/json"})
NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl"})
CREATE_FIELDS = frozenset({"items", "reduce_gates", "on_item_failure", "key", "priority",
                           "start_at", "quorum", "notify", "pipeline",
                           "pipeline_version"})
ADD_FIELDS = frozenset({"items"})
# id length, gate, data length, not_before (microseconds since the epoch, UTC; NO_TIME: none)
_RECORD = struct.Struct("<IIQq")
NO_TIME = -(2**63)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Limits:
    """What a request may carry: an item's data (``max_item_bytes``, as the client's),
    a body read whole (``max_body_bytes``: JSON, and every add) and an NDJSON create
    streamed to a spool (``max_upload_bytes``); and how often one client address may
    call the completion routes (``completions_per_minute``,
    :mod:`processor.api.client_rate`)."""

    max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    # Requests to the completion routes per client address a minute (0: no bound).
    completions_per_minute: int = DEFAULT_COMPLETIONS_PER_MINUTE

    @property
    def max_line_bytes(self) -> int:
        """The longest NDJSON line: twice an item's data limit, plus room for the id."""
        return 2 * self.max_item_bytes + LINE_OVERHEAD_BYTES


class Spool:
    """Checked items (with their ``not_before``) in a temporary file, in arrival order:
    memory holds a few MiB of them whatever their number. ``count`` and ``first_gate``
    (the lowest gate) are kept as they are added."""

    def __init__(self) -> None:
        self.file = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)
        self.count = 0
        self.first_gate: int | None = None

    def add(self, item: NewItem) -> None:
        """Append a checked item (its gate set)."""
        gate = item.gate or 0
        encoded = item.id.encode()
        not_before = (NO_TIME if item.not_before is None
                      else (item.not_before - EPOCH) // timedelta(microseconds=1))
        self.file.write(_RECORD.pack(len(encoded), gate, len(item.data), not_before))
        self.file.write(encoded)
        self.file.write(item.data)
        self.count += 1
        self.first_gate = gate if self.first_gate is None else min(self.first_gate, gate)

    def batches(self, size: int = SPOOL_BATCH) -> Iterator[list[NewItem]]:
        """The items again, ``size`` at a time, from the start."""
        self.file.seek(0)
        batch: list[NewItem] = []
        for _ in range(self.count):
            id_length, gate, data_length, micros = _RECORD.unpack(
                self.file.read(_RECORD.size))
            item_id = self.file.read(id_length).decode()
            not_before = None if micros == NO_TIME else EPOCH + timedelta(microseconds=micros)
            batch.append(NewItem(item_id, self.file.read(data_length), gate, not_before))
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch

    def repeated_ids(self) -> list[str]:
        """The ids that appear more than once, or that equal another but for trailing
        spaces (what MariaDB and SQL Server take for one id): read when the database
        refused the insert, to name them."""
        seen: dict[str, list[str]] = {}
        for batch in self.batches():
            for item in batch:
                seen.setdefault(item.id.rstrip(" "), []).append(item.id)
        return sorted({one for group in seen.values() if len(group) > 1 for one in group})

    def close(self) -> None:
        self.file.close()


class RequestDigest:
    """The SHA-256 of a create: the route's idempotency key, the body's media type, the
    settings and every byte of the body. The same request gives the same digest."""

    def __init__(self, idempotency_key: str | None, media_type: str) -> None:
        self._hash = hashlib.sha256(b"statefeed-create/1\n")
        self._hash.update(json.dumps([idempotency_key, media_type]).encode() + b"\n")

    def update(self, chunk: bytes) -> None:
        self._hash.update(chunk)

    def settle(self, settings: PartitionSettings, start_at: datetime | None = None) -> str:
        """The digest, once the body has been read whole: ``settings`` (from the query
        or the body) and ``start_at`` are part of it. The key, the priority and the
        start time (and a quorum, a notify URL) count only when set, so a request
        without them has the digest it had before they existed."""
        self._hash.update(b"\n" + json.dumps(
            [sorted(settings.reduce_gates), settings.continue_on_failure]).encode())
        if settings.key or settings.priority or start_at is not None:
            self._hash.update(b"\n" + json.dumps(
                [settings.key, settings.priority,
                 None if start_at is None else start_at.isoformat()]).encode())
        if settings.quorum:
            self._hash.update(b"\nquorum " + json.dumps(settings.quorum).encode())
        if settings.notify is not None:
            self._hash.update(b"\nnotify " + json.dumps(settings.notify).encode())
        if settings.pipeline != DEFAULT_PIPELINE or settings.pipeline_version is not None:
            self._hash.update(b"\npipeline " + json.dumps(
                [settings.pipeline, settings.pipeline_version]).encode())
        return self._hash.hexdigest()


class NdjsonItems:
    """Splits an NDJSON stream into lines and checks each as a new item into a
    :class:`Spool`. Blank lines are skipped; lines are numbered from 1."""

    def __init__(self, partition_id: str, limits: Limits, spool: Spool,
                 digest: RequestDigest | None = None, *, whole: bool = False) -> None:
        self.partition_id = partition_id
        self.limits = limits
        # A body read whole (an add) has the body limit; a create's stream the upload's.
        self.max_bytes, self.limit_option = (
            (limits.max_body_bytes, "--max-body-bytes") if whole
            else (limits.max_upload_bytes, "--max-upload-bytes"))
        self.spool = spool
        self.digest = digest
        self.received = 0
        self.lines = 0
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the stream.

        Raises:
            ApiError: the stream is over its limit, a line is over the line
                limit, or a line is not a valid item (413, 400 or 422).
        """
        self.received += len(chunk)
        if self.received > self.max_bytes:
            raise too_large(f"the body is over {self.max_bytes} bytes ({self.limit_option}): "
                            "send the items in several requests")
        if self.digest is not None:
            self.digest.update(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        if len(self._partial) > self.limits.max_line_bytes:
            raise self._line_too_long(self.lines + 1)

    def finish(self) -> None:
        """The stream ended whole: check its last line (one without a newline).

        Raises:
            ApiError: as :meth:`feed`.
        """
        if self._partial:
            self._line(self._partial)
            self._partial = b""

    def _line(self, raw: bytes) -> None:
        self.lines += 1
        number = self.lines
        if len(raw) > self.limits.max_line_bytes:
            raise self._line_too_long(number)
        if not raw.strip():
            return
        where = f"line {number}"
        try:
            entry = parse_new_item(decode_json(raw, where, unique_keys=True), f"{where}: ")
        except MalformedResponseError as error:
            raise bad_request(str(error), line=number,
                              field=error.key if isinstance(error, RepeatedKeyError)
                              else None) from None
        try:
            self.spool.add(check_item(self.partition_id, entry, number - 1,
                                      self.limits.max_item_bytes))
        except InvalidInputError as error:
            raise from_statefeed(InvalidInputError(f"{where}: {error}"), line=number) from None

    def _line_too_long(self, number: int) -> ApiError:
        return too_large(f"line {number} is over {self.limits.max_line_bytes} bytes; an item's "
                         f"data may be at most {self.limits.max_item_bytes} bytes "
                         "(--max-item-bytes)", line=number)


def json_document(body: bytes, allowed: frozenset[str]) -> dict[str, Any]:
    """A JSON body that must be an object with only ``allowed`` keys.

    Raises:
        ApiError: 400 when it is not JSON, not an object, or has an unknown key or a
            key twice (in any object in it: the field names that key).
    """
    try:
        document = decode_json(body, unique_keys=True)
    except MalformedResponseError as error:
        raise bad_request(str(error), field=error.key if isinstance(error, RepeatedKeyError)
                          else None) from None
    if not isinstance(document, dict):
        raise bad_request(f"the body must be a JSON object with {listed(allowed)}")
    unknown = sorted(set(document) - allowed)
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}; the body may have {listed(allowed)}",
                          field=unknown[0])
    return document


def json_items(partition_id: str, value: Any, limits: Limits, *, allow_empty: bool
               ) -> list[NewItem]:
    """The ``items`` of a JSON body, checked as the client checks them (ids, gates,
    sizes, repeats).

    Raises:
        ApiError: 400 for a shape that is not a list of new items (the field names
            the entry), 422 for items the rules refuse.
    """
    if value is None:
        value = []
    if not isinstance(value, list):
        raise bad_request("'items' must be an array of new items "
                          '({"id": "a", "gate": 0, "data": {}})', field="items")
    items = []
    for position, entry in enumerate(value):
        where = f"items[{position}]"
        try:
            items.append(parse_new_item(entry, f"{where}: "))
        except MalformedResponseError as error:
            raise bad_request(str(error), field=where) from None
    try:
        return check_items(partition_id, items, allow_empty=allow_empty,
                           max_item_bytes=limits.max_item_bytes)
    except InvalidInputError as error:
        raise from_statefeed(error, field="items") from None


def listed(names: frozenset[str]) -> str:
    """``names`` quoted, in order, joined by commas: what a body or query may hold."""
    return ", ".join(repr(name) for name in sorted(names))
