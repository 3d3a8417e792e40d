"""The API's one error shape, and which HTTP status each of statefeed's errors is.

Every error answer is ``{"error": {"status", "code", "message", "field", "line"}}``:
``code`` is stable for programs, ``message`` says what is wrong and what to do,
``field`` names the part of the request at fault (``"items[3]"``, ``"reduce_gates"``,
``"partition_id"``) and ``line`` the NDJSON line, each ``null`` when it does not
apply. Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from watcher.errors import (
    DatabaseError,
    DuplicateItemError,
    GateError,
    InvalidInputError,
    KeyNotFoundError,
    PartitionChangedError,
    PartitionExistsError,
    PartitionLeasedError,
    PartitionNotFoundError,
    ValueRefusedError,
)


@dataclass
class ApiError(Exception):
    """An answer other than success: its status, code and message, and where the
    request went wrong (``field``, ``line``)."""

    status: int
    code: str
    message: str
    field: str | None = None
    line: int | None = None
    # Headers the answer carries besides the error body (Retry-After, Allow).
    headers: dict[str, str] = dataclass_field(default_factory=dict)

    def __str__(self) -> str:
        return self.message

    def body(self) -> bytes:
        """The JSON body of the answer."""
        document = {"error": {"status": self.status, "code": self.code,
                              "message": self.message, "field": self.field, "line": self.line}}
        try:
            return json.dumps(document, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            # A field named in the request may hold an unpaired surrogate (a JSON key
            # "\udc00"), which UTF-8 cannot carry; JSON's \u escapes can.
            return json.dumps(document).encode()


def bad_request(message: str, *, field: str | None = None, line: int | None = None
                ) -> ApiError:
    """A body or parameter that is not what the route takes (400 ``bad_request``)."""
    return ApiError(400, "bad_request", message, field, line)


JSON_HEADER = "Content-Type: application/json"


def unsupported_media(given: str | None, *, ndjson: bool = False,
                      example: str = "") -> ApiError:
    """A body whose ``Content-Type`` the route does not take (415
    ``unsupported_media_type``): the message says exactly which header to send (curl
    sends a form's type with ``-d`` unless told), and ``example`` is a body it takes.
    A form's type is refused on purpose: a web page can post one cross-site without a
    preflight."""
    shown = (given or "").split(";")[0].strip()
    items = (" (or 'Content-Type: application/x-ndjson' for items, one per line)"
             if ndjson else "")
    such = f", such as {example}" if example else ""
    return ApiError(415, "unsupported_media_type",
                    f"Content-Type {shown or '(none)'!r} is not taken here: send the header "
                    f"'{JSON_HEADER}'{items} with a JSON body{such} (with curl: -H "
                    f"'{JSON_HEADER.lower()}')", "Content-Type")


def too_large(message: str, *, field: str | None = None, line: int | None = None
              ) -> ApiError:
    """A body, line or item over its limit (413 ``too_large``)."""
    return ApiError(413, "too_large", message, field, line)


def from_statefeed(error: Exception, *, field: str | None = None, line: int | None = None
                   ) -> ApiError:
    """The answer for an error the client library raises: 404 for a partition or a key
    that is not there, 409 for a conflict with what is stored, 422 for input the rules refuse, 413
    for a value the database refuses for its size, 503 for a database that failed.
    Anything else is not statefeed's: it is re-raised.

    Raises:
        Exception: ``error`` itself, when it is none of those.
    """
    message = str(error)
    if isinstance(error, PartitionNotFoundError):
        return ApiError(404, "partition_not_found",
                        f"partition {error.partition_id!r} does not exist; create it with "
                        "PUT /v1/partitions/{id}", "partition_id")
    if isinstance(error, KeyNotFoundError):
        return ApiError(404, "key_not_found", (
            f"no partition has had key {error.key!r}, so it is unknown (a typo?); nothing was "
            "written: GET /v1/keys lists the keys with controls, and "
            '{"define": true} in POST /v1/keys/{key}/limits sets one up before its first '
            "partition"), "key")
    if isinstance(error, PartitionExistsError):
        return ApiError(409, "partition_exists", (
            f"partition {error.partition_id!r} already exists: a retried create answers as "
            "the first did only with the same Idempotency-Key (or none both times), query "
            "and body; add items with POST /v1/partitions/{id}/items"), "partition_id")
    if isinstance(error, DuplicateItemError):
        if error.stored:
            return ApiError(409, "items_exist", message, field, line)
        return ApiError(422, "duplicate_items", message, field, line)
    if isinstance(error, PartitionChangedError):
        return ApiError(409, "version_conflict", message, "version")
    if isinstance(error, GateError):
        return ApiError(409, "gate_conflict", message, field, line)
    if isinstance(error, PartitionLeasedError):
        return ApiError(409, "partition_leased", message + "; add ?force=true to cancel it "
                        "and delete it anyway", "partition_id")
    if isinstance(error, InvalidInputError):
        return ApiError(422, "invalid_input", message, field, line)
    if isinstance(error, ValueRefusedError):
        return too_large(message, field=field, line=line)
    if isinstance(error, DatabaseError):
        return ApiError(503, "database_unavailable", message)
    raise error

