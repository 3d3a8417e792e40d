"""What a handler function receives (:class:`Item`) and returns (:class:`Result`)."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from handlers.errors import ItemDataError

MAX_GATE: Final = 2**31 - 1  # the processor stores gates as 32-bit integers
_SHOWN_ERROR_CHARS = 200


class _Unset(enum.Enum):
    """The type of :data:`UNSET`; an enum so type checkers can narrow on it."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset.UNSET
"""``Result.data`` when the handler leaves the item's bytes as they are."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One item, as the processor sent it.

    - ``id``, ``partition_id``: the item and its partition (already percent-decoded).
    - ``gate``: the item's current gate (the partition's gate while it runs).
    - ``attempt``: 1 on the first call for this step, 2 after one failed attempt, ...
    - ``idempotency_key``: the same for every retry of one step of one item; use
      it to make side effects (charging, e-mailing) happen once.
    - ``data``: the item's bytes, unchanged.
    - ``completion_token``: this call's token (the ``X-Completion-Token`` header).
      If the answer parks the item (``Result(wait=...)``), whoever holds it
      completes the wait: ``POST /v1/completions/{token}`` on ``processor api``.
      Hand it to the outside system (an e-mail link, a webhook URL); never log it.
      ``""`` when the processor sent none.
    - ``status``, ``last_error``: in a reduce, ``"failed"`` and the error for an
      item that failed at an earlier gate of a partition that carries on
      without it; ``"available"`` and ``None`` otherwise.
    - ``in_reduce``: the item came in a reduce page. The processor puts the
      partition, gate and attempt (and, for a per-item call, the item) before
      every error it stores, so the SDK's own messages name only what it
      leaves out: the item, in a reduce.

    Keyword-only, so tests of handler functions can build items without
    mixing up the two ids: ``Item(id="r1", partition_id="p", data=b"{}")``.
    """

    id: str
    partition_id: str
    gate: int = 0
    attempt: int = 1
    idempotency_key: str = ""
    data: bytes = b""
    status: str = "available"
    last_error: str | None = None
    in_reduce: bool = False
    completion_token: str = field(default="", repr=False)

    @property
    def failed(self) -> bool:
        """Whether the item failed at an earlier gate (seen only by a reduce)."""
        return self.status == "failed"

    def json(self) -> Any:
        """The data decoded as JSON (UTF-8; ``NaN`` and ``Infinity`` are refused).

        Raises:
            ItemDataError: the data is not valid JSON (the message names the item in a
                reduce page; for a per-item call the processor names it).
                Uncaught, it becomes a non-retryable 400 answer.
        """
        try:
            return json.loads(self.data, parse_constant=reject_json_constant)
        except RecursionError:
            raise ItemDataError(
                f"{self._named()}data is JSON nested too deeply to decode") from None
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
            raise ItemDataError(
                f"{self._named()}data is not valid JSON "
                f"({_shorten(str(error))}); it starts with {self.data[:40]!r}") from None

    def text(self) -> str:
        """The data decoded as UTF-8 text.

        Raises:
            ItemDataError: the data is not valid UTF-8 (named as for :meth:`json`).
                Uncaught, it becomes a non-retryable 400 answer.
        """
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ItemDataError(
                f"{self._named()}data is not valid UTF-8 text ({error})") from None

    def _named(self) -> str:
        """What an error message of the SDK starts with: the item in a reduce page (the
        processor names the page, not the item), nothing for a per-item call (the
        processor names the partition, item, gate and attempt)."""
        return f"item {self.id!r}: " if self.in_reduce else ""

    def describe(self) -> str:
        """The partition, item, gate and attempt, for a handler's own logs. Error messages
        need none of it: the processor adds it to what it stores."""
        return (f"partition {self.partition_id!r} item {self.id!r} gate {self.gate} "
                f"(attempt {self.attempt})")


@dataclass(frozen=True, slots=True)
class Spawn:
    """A new item of the partition, spawned by an answer (``Result(spawn=[...])``).

    - ``id``: its id, unique in the partition (a repeat fails the spawning item,
      and is not retried): derive it from the parent's id, so a step that runs
      again spawns the same ids.
    - ``data``: its content, as :attr:`Result.data` (bytes as they are, any other
      value as its JSON encoding).
    - ``gate``: where it starts; ``None`` is the gate the spawning item was called
      at (a reduce's default is the gate after the reduce gate).

    Raises:
        TypeError: ``id`` is not a non-empty string, or ``gate`` is not an int or ``None``.
        ValueError: ``gate`` is negative or beyond a 32-bit integer.
    """

    id: str
    data: Any
    gate: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise TypeError(f"Spawn(id=...) must be a non-empty string, got {self.id!r}")
        _check_gate("Spawn", self.gate)


def _check_snooze(result: Result) -> None:
    snooze = result.snooze
    if isinstance(snooze, bool) or not isinstance(snooze, int | float):
        raise TypeError(f"Result(snooze=...) must be a number of seconds, got {snooze!r}")
    if not snooze > 0 or snooze == float("inf"):
        raise ValueError(f"Result(snooze=...) must be a number of seconds above 0, "
                         f"got {snooze!r}")
    if result.done or result.gate is not None:
        raise ValueError("Result(snooze=...) keeps the item at its gate to call it again "
                         "later; it cannot come with done or gate")


MAX_WAIT_SECONDS: Final = 30 * 24 * 3600


def _wait_mapping(result: Result) -> dict[str, Any]:
    """``Result.wait`` as the answer's ``wait`` object. Raises TypeError or ValueError
    naming what is wrong."""
    wait = result.wait
    if not isinstance(wait, Mapping):
        wait = {"timeout": wait}
    unknown = set(wait) - {"timeout", "on_timeout"}
    if unknown:
        raise TypeError(f"Result(wait=...) takes 'timeout' and 'on_timeout', got "
                        f"{sorted(map(str, unknown))}")
    timeout = wait.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"Result(wait=...) timeout must be a number of seconds, got {timeout!r}")
    if not 0 < timeout <= MAX_WAIT_SECONDS:
        raise ValueError(f"Result(wait=...) timeout must be above 0 and at most "
                         f"{MAX_WAIT_SECONDS} s (30 days), got {timeout!r}")
    if wait.get("on_timeout") not in (None, "retry", "fail"):
        raise ValueError(f"Result(wait=...) on_timeout must be 'retry' or 'fail', got "
                         f"{wait.get('on_timeout')!r}")
    if result.done or result.gate is not None or result.snooze is not None:
        raise ValueError("Result(wait=...) parks the item at its gate; it cannot come with "
                         "done, gate or snooze")
    return {key: value for key, value in wait.items() if value is not None}


def _check_gate(owner: str, gate: object) -> None:
    if gate is None:
        return
    if type(gate) is not int:  # bool is an int subclass; True is no gate
        raise TypeError(f"{owner}(gate=...) must be an int or None, got {gate!r}")
    if not 0 <= gate <= MAX_GATE:
        raise ValueError(f"{owner}(gate=...) must be between 0 and {MAX_GATE}, got {gate}")


def _spawn_tuple(owner: str, spawn: object) -> tuple[Spawn, ...]:
    """``spawn`` as a tuple of :class:`Spawn` (mappings with ``id``, ``data`` and
    ``gate`` are taken as one). Raises TypeError naming what is wrong."""
    if isinstance(spawn, str | bytes | Mapping | Spawn) or not isinstance(spawn, Sequence):
        raise TypeError(f"{owner}(spawn=...) must be a list of handlers.Spawn, got "
                        f"{type(spawn).__name__}")
    children = []
    for position, child in enumerate(spawn):
        if isinstance(child, Mapping):
            unknown = set(child) - {"id", "data", "gate"}
            if unknown or "id" not in child or "data" not in child:
                raise TypeError(f"{owner}(spawn=...)[{position}] must have 'id' and 'data' "
                                f"(and 'gate'), got keys {sorted(map(str, child))}")
            child = Spawn(**child)
        if not isinstance(child, Spawn):
            raise TypeError(f"{owner}(spawn=...)[{position}] must be a handlers.Spawn, got "
                            f"{type(child).__name__}")
        children.append(child)
    return tuple(children)


@dataclass(frozen=True, slots=True)
class Result:
    """A handler function's answer for one item.

    - ``gate``: the item's next gate; ``None`` keeps the current gate. Moving to a
      gate below the partition's gate is refused by the processor.
    - ``done``: ``True`` completes the item.
    - ``data``: the item's new content. ``bytes`` (or ``bytearray``/``memoryview``)
      are stored as they are (sent as ``data_b64``); any other value is stored as
      its compact JSON encoding (sent as ``data``), so ``data=None`` stores the
      four bytes ``null``. Leave it unset (:data:`UNSET`) to keep the stored bytes.

    - ``spawn``: new items of the partition (:class:`Spawn`), inserted with this
      answer and only if it is written, so exactly once. At most the processor's
      ``--max-spawn`` (1,000 by default) per answer: page a larger fan-out (spawn
      a slice, keep a cursor in ``data``, answer ``Result()`` to be called again).

    - ``snooze``: seconds to wait before the item is called again at the same gate
      (to poll an outside system): a success, so it uses up no attempt. It may
      come with ``data`` (a cursor) and ``spawn``, not with ``done`` or ``gate``.
      The processor caps it (a week by default).

    - ``wait``: park the item at its gate until someone outside completes it with
      :attr:`Item.completion_token`, or the timeout passes: seconds (at most 30
      days), or ``{"timeout": seconds, "on_timeout": "retry" | "fail"}``. It may
      come with ``data`` and ``spawn``, not with ``done``, ``gate`` or ``snooze``.

    ``Result()`` (same gate, not done, data kept) runs the item again: a loop.

    Raises:
        TypeError: ``gate`` is not an integer or ``None``, ``done`` is not a bool,
            ``snooze`` is not a number, or ``spawn`` is not a list of :class:`Spawn`.
        ValueError: ``gate`` is negative or beyond a 32-bit integer, ``snooze`` is not
            above 0, or ``snooze`` comes with ``done`` or ``gate``.
    """

    gate: int | None = None
    done: bool = False
    data: Any = field(default=UNSET)
    spawn: Sequence[Spawn] = ()
    snooze: float | None = None
    wait: Any = None

    def __post_init__(self) -> None:
        _check_gate("Result", self.gate)
        if type(self.done) is not bool:
            raise TypeError(f"Result(done=...) must be True or False, got {self.done!r}")
        if self.snooze is not None:
            _check_snooze(self)
        if self.wait is not None:
            object.__setattr__(self, "wait", _wait_mapping(self))
        if self.spawn:
            object.__setattr__(self, "spawn", _spawn_tuple("Result", self.spawn))


@dataclass(frozen=True, slots=True, kw_only=True)
class ReducePage:
    """What a reduce function receives: a whole gate, or one page of a pass.

    - ``pass_``: ``"all"`` (every item of the gate, answered at once), ``"fold"``
      (return the next accumulator) or ``"apply"`` (answer per item, given the
      final accumulator).
    - ``page`` (0-based) and ``last``: the position in the pass.
    - ``items``: the page's items in id order; failed ones (``item.failed``)
      are shown for information and cannot be answered.
    - ``accumulator``: the previous fold page's accumulator (``None`` on the
      first), or the final one during the apply pass.
    - ``idempotency_key``: the same for every retry of this page.
    """

    partition_id: str
    gate: int
    attempt: int = 1
    pass_: str = "all"
    page: int = 0
    last: bool = True
    idempotency_key: str = ""
    items: tuple[Item, ...] = ()
    accumulator: Any = None

    def describe(self) -> str:
        """The partition, gate, pass, page and attempt, for a handler's own logs. Error
        messages need none of it: the processor adds it to what it stores."""
        return (f"partition {self.partition_id!r} gate {self.gate} reduce {self.pass_} "
                f"page {self.page} (attempt {self.attempt})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reduced:
    """A reduce function's answer.

    - ``items``: per item id, the item's :class:`Result`; it must complete the
      item or move it to a later gate.
    - ``default``: the result of the items not named; ``None`` completes them.
    - ``result``: the partition result (JSON-compatible value, or bytes);
      leave it :data:`UNSET` to store none.
    - ``accumulator``: a fold page's answer (a JSON-compatible value).
    - ``spawn``: new items (:class:`Spawn`) at gates after the reduce gate (a
      gate of ``None`` is the next one): how a map, reduce, map pipeline goes on.
      Not on a fold page.

    Raises:
        TypeError: ``spawn`` is not a list of :class:`Spawn`.
    """

    items: Mapping[str, Result] = field(default_factory=dict)
    default: Result | None = None
    result: Any = UNSET
    accumulator: Any = UNSET
    spawn: Sequence[Spawn] = ()

    def __post_init__(self) -> None:
        if self.spawn:
            object.__setattr__(self, "spawn", _spawn_tuple("Reduced", self.spawn))


def reject_json_constant(name: str) -> Any:
    """``json.loads(parse_constant=...)``: refuse ``NaN`` and ``Infinity``.

    Raises:
        ValueError: always.
    """
    raise ValueError(f"{name} is not valid JSON")


def _shorten(text: str) -> str:
    return text if len(text) <= _SHOWN_ERROR_CHARS else text[:_SHOWN_ERROR_CHARS] + "..."
