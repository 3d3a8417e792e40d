"""Replay: send a stored item's call to a handler again (``processor replay``, the
console's "Replay to…" form), read its answer as a processor would, and say what
writing it would do.

The call is rebuilt from the stored item with the processor's own code: the
:class:`~watcher.protocol.WorkItem` the supervisor makes, its headers from
:func:`processor.wire.contract.item_headers`, its body the item's bytes, the answer read
by :func:`processor.wire.contract.read_item_reply`, and sent by the processor's
:class:`~processor.http.transports.HttpxSender`. What cannot be rebuilt is said by
:func:`replay_call`: a completion token is new for every call (only its hash is
stored), and an item whose last answer moved it holds that answer's data and gate, not
the call's.

Apart from :func:`send_replay`, everything here is pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processor.client.async_client import AsyncClient
from processor.http.config import DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_RESPONSE_BYTES, check_url
from processor.http.transports import HttpxSender, SenderSettings, TransportError
from processor.observe.redact import redact_url
from processor.wire.contract import item_headers, read_item_reply
from processor.wire.errors import item_error
from processor.wire.values import Failure, Reply
from watcher.errors import ItemChangedError, StatefeedError
from watcher.models import AVAILABLE, FAILED
from watcher.protocol import ProcessorError, Result, WorkItem
from watcher.records import ItemInfo, ItemWrite, ReadyItem
from watcher.rules.decisions import RetryPolicy, write_for_outcome
from watcher.rules.delays import MAX_SNOOZE_SECONDS
from watcher.rules.spawn import SpawnLimits
from watcher.store.operator.replays import AppliedAnswer

DEFAULT_REPLAY_TIMEOUT = 30.0
DEFAULT_POLICY = RetryPolicy()
# The start of the error a wait's time-out records (watcher.waits): its "call" was the
# parking one, whose answer may have changed the item.
_WAIT_TIMED_OUT = "timed out waiting after"


class ReplayError(StatefeedError):
    """A replayed call got no answer (a bad URL, the handler down, a time-out); the
    message says what happened, in one line. Nothing was written."""


@dataclass(frozen=True, slots=True)
class ReplayCall:
    """The call to send: ``work`` (its headers and body come from it), whether it is the
    item's ``last`` call again (else the call the processor makes next), and ``what``:
    one sentence that says precisely which call it is."""

    work: WorkItem
    last: bool
    what: str

    @property
    def headers(self) -> dict[str, str]:
        """The request's headers, as the processor sends them."""
        return item_headers(self.work)

    @property
    def body(self) -> bytes:
        """The request's body: the item's bytes, unchanged."""
        return self.work.data


def replay_call(item: ItemInfo, *, pipeline: str = "default",
                pipeline_version: str | None = None) -> ReplayCall:
    """The call a replay sends for ``item`` (read with its data).

    The processor's next call for the stored item is
    ``WorkItem(partition, id, gate, attempts + 1, data, version)``; its
    ``Idempotency-Key`` is the step's (:func:`watcher.rules.decisions.idempotency_step`),
    the same for every retry of one step. When the item's last call failed (it is
    available or failed, its latest error is that attempt's at its gate, and no wait
    timed out), the error changed neither its gate nor its data, so that call is rebuilt
    whole: the same body, gate, ``X-Attempt`` and key. Otherwise the last answer (or a
    wait's end, a retry, a rewind) may have changed the item, so the replay is the call
    the processor makes next. Either way ``X-Completion-Token`` is new.
    """
    pid = item.partition_id
    following = WorkItem(pid, item.id, item.gate, item.attempts + 1, item.data, item.version,
                         pipeline=pipeline, pipeline_version=pipeline_version)
    latest = item.error_history[-1] if item.error_history else None
    last_failed = (item.status in (AVAILABLE, FAILED) and item.attempts >= 1
                   and latest is not None and latest.attempt == item.attempts
                   and latest.gate == item.gate
                   and not latest.error.startswith(_WAIT_TIMED_OUT))
    token_note = ("a new X-Completion-Token (a token is made for each call, and only its "
                  "hash is stored)")
    if last_failed:
        work = WorkItem(pid, item.id, item.gate, item.attempts, item.data, item.version,
                        following.idempotency_key, pipeline=pipeline,
                        pipeline_version=pipeline_version)
        return ReplayCall(work, True, (
            f"the item's last call (attempt {item.attempts} at gate {item.gate}, which "
            f"failed): the same body, gate, X-Attempt and Idempotency-Key, with "
            f"{token_note}"))
    if item.status == AVAILABLE and item.attempts == 0:
        why = ("its last answer, if it had one, may have changed its data and gate since "
               "that call")
    else:
        why = (f"the item is {item.status}: what ended its last call (an answer, a wait's "
               "time-out, a retry or a rewind) may have changed its data and gate, so that "
               "call cannot be rebuilt")
    return ReplayCall(following, False, (
        f"the call the processor makes next for the item as stored (attempt "
        f"{following.attempt} at gate {item.gate}; {why}), with {token_note}"))


@dataclass(frozen=True, slots=True)
class ReplayAnswer:
    """What the handler answered a replayed call: its ``reply`` as it came, and the
    ``outcome`` a processor reads from it (a result, or the failure the call is)."""

    reply: Reply
    outcome: Result | Failure


def check_replay_url(url: str) -> str:
    """``url`` if a replay can be sent there.

    Raises:
        ReplayError: not an absolute http(s) URL with a host (the message says why).
    """
    from watcher.errors import ConfigError

    try:
        return check_url("--to", url, example="http://127.0.0.1:8000/")
    except ConfigError as error:
        raise ReplayError(str(error)) from None


async def send_replay(call: ReplayCall, url: str, *, headers: Mapping[str, str] | None = None,
                      request_timeout: float = DEFAULT_REPLAY_TIMEOUT,
                      max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> ReplayAnswer:
    """POST ``call`` to ``url`` (with ``headers`` on top, such as ``Authorization``) through
    the processor's sender, and read the answer as the processor does (redirects are not
    followed: the contract says so).

    Raises:
        ReplayError: ``url`` is not an http(s) URL, no answer came (refused, reset, a
            name that does not resolve, TLS), or none within ``request_timeout`` seconds.
    """
    check_replay_url(url)
    shown = redact_url(url)
    sender = HttpxSender(SenderSettings(
        headers=dict(headers or {}), request_timeout=request_timeout,
        connect_timeout=min(request_timeout, DEFAULT_CONNECT_TIMEOUT),
        max_response_bytes=max_response_bytes, max_connections=1, verify=True,
        shown_url=shown))
    try:
        reply = await sender.post(url, call.body, call.headers, shown_url=shown)
    except TimeoutError:
        raise ReplayError(f"no complete answer from {shown} within {request_timeout:g} s; nothing "
                          "was written") from None
    except TransportError as error:
        raise ReplayError(f"no answer: {error.reason}; nothing was written") from None
    finally:
        await sender.aclose()
    return ReplayAnswer(reply, read_item_reply(reply, max_bytes=max_response_bytes))


def answer_outcome(call: ReplayCall, answer: ReplayAnswer) -> Result | ProcessorError:
    """The outcome a processor writes for ``answer``: its result, or the engine's error
    for its failure (:func:`processor.wire.errors.item_error`)."""
    if isinstance(answer.outcome, Failure):
        return item_error(call.work, answer.outcome)
    return answer.outcome


def unwritable(answer: ReplayAnswer) -> str | None:
    """Why a processor would write nothing for ``answer`` (an outage or a throttle, which
    spend no attempt and only hold the calls back), or ``None`` when it writes it."""
    outcome = answer.outcome
    if isinstance(outcome, Failure) and (outcome.unanswered or outcome.throttled):
        kind = "gave no answer (an outage)" if outcome.unanswered else "asked to slow down"
        return (f"the handler's service {kind}: a processor writes nothing for that "
                "and calls again later")
    return None


def preview_write(item: ItemInfo, call: ReplayCall, answer: ReplayAnswer, partition_gate: int,
                  *, policy: RetryPolicy = DEFAULT_POLICY,
                  max_item_bytes: int = SpawnLimits().max_item_bytes) -> ItemWrite:
    """The write ``--apply`` would make of ``answer`` to ``item`` (its partition at
    ``partition_gate``): the processor's decision
    (:func:`watcher.rules.decisions.write_for_outcome`), on the item as read."""
    ready = ReadyItem(item.id, item.version, item.gate, b"", item.attempts,
                      wait_key=None)
    return write_for_outcome(item.partition_id, ready, answer_outcome(call, answer),
                             partition_gate, policy, max_data_bytes=max_item_bytes,
                             max_snooze=MAX_SNOOZE_SECONDS,
                             spawn_limits=SpawnLimits(max_item_bytes=max_item_bytes),
                             completion_token=call.work.completion_token)


def answer_fields(answer: ReplayAnswer) -> dict[str, Any]:
    """The answer as plain values for ``--json`` and the console: the HTTP status, the
    body (its JSON value, or its text) and what a processor reads from it."""
    reply = answer.reply
    body: Any = None
    if reply.body is not None:
        try:
            body = json.loads(reply.body)
        except ValueError:
            body = reply.body.decode("utf-8", "replace")
    outcome = answer.outcome
    if isinstance(outcome, Failure):
        read: dict[str, Any] = {"error": outcome.reason, "retryable": outcome.retryable}
    else:
        read = {"gate": outcome.gate, "done": outcome.done,
                "data_bytes": None if outcome.data is None else len(outcome.data),
                "spawn": [new.id for new in outcome.spawn], "snooze": outcome.snooze,
                "wait": None if outcome.wait is None else outcome.wait.timeout}
    return {"status": reply.status, "body": body, "read": read}


def comparison(item: ItemInfo, write: ItemWrite, *, data_limit: int | None = 2000
               ) -> list[tuple[str, str, str]]:
    """The stored item beside what writing the replayed answer would make of it, as
    ``(field, stored, after)`` rows of plain text (data JSON pretty-printed, other bytes
    in hex, cut after ``data_limit`` characters). Texts are data: the caller escapes
    them for its screen."""
    from processor.views import data_lines

    def data_text(data: bytes | None) -> str:
        if data is None:
            return "(kept)"
        kind, lines = data_lines(data, data_limit)
        return "\n".join([kind, *lines])

    rows = [("status", item.status, write.status),
            ("gate", str(item.gate), str(item.gate if write.gate is None else write.gate)),
            ("attempts", str(item.attempts), str(write.attempts)),
            ("error", item.last_error or "-", write.last_error or "-"),
            ("data", data_text(item.data), data_text(write.data))]
    if write.spawn:
        rows.append(("spawn", "-", ", ".join(repr(new.id) for new in write.spawn)))
    if write.wait is not None:
        rows.append(("wait", "-", f"parked up to {write.retry_delay:g} s; the replayed "
                                  "call's X-Completion-Token completes it"))
    elif write.retry_delay:
        rows.append(("called again", "-", f"in {write.retry_delay:.1f} s"))
    return rows


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """One replay: the ``item`` as read, the ``call`` sent, the ``answer``, the ``write``
    that applying it makes (``None`` when a processor would write nothing:
    ``unwritten`` says why), and, with ``apply``, what was written (``applied``)."""

    item: ItemInfo
    call: ReplayCall
    answer: ReplayAnswer
    write: ItemWrite | None
    unwritten: str | None
    applied: AppliedAnswer | None = None


async def replay_item(client: AsyncClient, partition_id: str, item_id: str, url: str, *,
                      headers: Mapping[str, str] | None = None,
                      request_timeout: float = DEFAULT_REPLAY_TIMEOUT,
                      apply: bool = False, version: int | None = None) -> ReplayReport:
    """Read the item, send its call to ``url`` (:func:`replay_call`, :func:`send_replay`)
    and, with ``apply``, write the answer under the item's version as read
    (:meth:`processor.client.AsyncClient.apply_answer`). ``version``: the item's
    version when the caller last showed it (the console's page); an item at another one
    is refused before any call.

    Raises:
        ReplayError: a bad URL or no answer (nothing written); or, with ``apply``, an
            answer a processor would not write (an outage, a throttle).
        PartitionNotFoundError, ItemNotFoundError: no such partition or item.
        AnswerRefusedError, ItemChangedError: with ``apply``, as
            :meth:`~processor.client.AsyncClient.apply_answer` says (nothing written);
            ItemChangedError too when the item is not at ``version``.
    """
    check_replay_url(url)
    item = await client.item(partition_id, item_id)
    if version is not None and item.version != version:
        raise ItemChangedError(partition_id, item_id, version, item.version)
    partition = await client.partition(partition_id)
    call = replay_call(item, pipeline=partition.pipeline,
                       pipeline_version=partition.pipeline_version)
    answer = await send_replay(call, url, headers=headers, request_timeout=request_timeout)
    unwritten = unwritable(answer)
    write = None if unwritten else preview_write(item, call, answer, partition.gate,
                                                 max_item_bytes=client.max_item_bytes)
    applied = None
    if apply:
        if unwritten:
            raise ReplayError(f"{unwritten}; nothing was written")
        applied = await client.apply_answer(partition_id, item_id, item.version,
                                            answer_outcome(call, answer),
                                            completion_token=call.work.completion_token)
    return ReplayReport(item, call, answer, write, unwritten, applied)
