"""What a handler's GET on the reduce URL says it takes (pure)."""

from __future__ import annotations

import pytest

from processor.http.reduce import _read_shape
from watcher.protocol import ReduceShape


@pytest.mark.parametrize(("status", "body", "shape"), [
    (200, b'{"pages": false, "max_body_bytes": 1000}', ReduceShape(False, 1000)),
    (200, b'{"pages": true}', ReduceShape(True, None)),
    (200, b'{"pages": true, "max_body_bytes": true}', ReduceShape(True, None)),
    (200, b'{"pages": true, "max_body_bytes": 0}', ReduceShape(True, None)),
    (200, b'{"pages": "no"}', None),  # not a yes or no: says nothing
    (200, b'{"status": "ok"}', None),  # a handler that answers every GET alike
    (200, b"[]", None),
    (200, b"not json", None),
    (200, None, None),  # over the answer limit
    (405, b'{"pages": false}', None),
    (404, b"", None),
])
def test_only_a_clear_answer_is_taken(status: int, body: bytes | None,
                                      shape: ReduceShape | None) -> None:
    assert _read_shape(status, body) == shape
