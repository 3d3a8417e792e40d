"""Spawn on the wire: what the SDK encodes, the processor decodes into the same items,
and every malformed shape is refused with a message naming the entry."""

from __future__ import annotations

import json

import pytest

import handlers
from handlers.wire.contract import ResultError, coerce_result, encode_result
from handlers.wire.reduce import coerce_reduced, encode_reduced
from processor.wire.contract import parse_answer, parse_spawn
from processor.wire.reduce import read_reduce_reply
from processor.wire.values import MalformedResponseError, Reply
from watcher.protocol import ReduceCall, Result
from watcher.records import NewItem


def decoded(result: handlers.Result) -> Result:
    parsed = parse_answer(json.loads(encode_result(result)))
    assert isinstance(parsed, Result)
    return parsed


def test_what_the_sdk_spawns_the_processor_reads_back() -> None:
    result = handlers.Result(gate=1, spawn=[
        handlers.Spawn("a", {"file": "a.pdf"}), handlers.Spawn("b", b"\x00\xff", gate=3),
        handlers.Spawn("c", None)])
    assert decoded(result) == Result(gate=1, spawn=(
        NewItem("a", b'{"file":"a.pdf"}', None), NewItem("b", b"\x00\xff", 3),
        NewItem("c", b"null", None)))


def test_a_spawn_without_data_or_gate_keeps_the_short_answers_right() -> None:
    assert encode_result(handlers.Result(done=True)) == b'{"done":true}'
    body = json.loads(encode_result(handlers.Result(spawn=[handlers.Spawn("x", 1)])))
    assert body == {"spawn": [{"id": "x", "data": 1}]}


def test_dict_results_and_dict_children_are_taken() -> None:
    result = coerce_result({"done": True, "spawn": [{"id": "k", "data": [1], "gate": 2}]})
    assert result.spawn == (handlers.Spawn("k", [1], 2),)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: handlers.Spawn("", 1), "non-empty string"),
    (lambda: handlers.Spawn(3, 1), "non-empty string"),
    (lambda: handlers.Spawn("a", 1, gate=True), "int or None"),
    (lambda: handlers.Spawn("a", 1, gate=-2), "between 0 and"),
    (lambda: handlers.Result(spawn="abc"), "list of handlers.Spawn"),
    (lambda: handlers.Result(spawn=[("a", 1)]), r"\[0\] must be a handlers.Spawn"),
    (lambda: handlers.Result(spawn=[{"id": "a"}]), "must have 'id' and 'data'"),
    (lambda: handlers.Reduced(spawn=handlers.Spawn("a", 1)), "list of handlers.Spawn"),
])
def test_the_sdk_refuses_bad_spawns_when_they_are_made(make, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def test_a_reduce_answer_spawns_from_its_top_level_only() -> None:
    reduced = coerce_reduced({"result": 1, "spawn": [handlers.Spawn("next", {})]})
    assert json.loads(encode_reduced(reduced))["spawn"] == [{"id": "next", "data": {}}]
    with pytest.raises(ResultError, match="Reduced\\(spawn"):
        coerce_reduced({"items": {"a": handlers.Result(done=True,
                                                       spawn=[handlers.Spawn("x", 1)])}})


@pytest.mark.parametrize(("value", "message"), [
    ({"id": "a"}, "'spawn' must be an array"),
    ("a", "'spawn' must be an array"),
    ([1], "spawn[0]: each new item must be an object"),
    ([{"id": "a", "data": 1, "extra": 2}], 'spawn[0]: unknown key "extra"'),
    ([{"data": 1}], "spawn[0]: 'id' must be a string"),
    ([{"id": None, "data": 1}], "spawn[0]: 'id' must be a string"),
    ([{"id": "a", "gate": "1", "data": 1}], "spawn[0]: 'gate' must be an integer"),
    ([{"id": "a", "gate": True, "data": 1}], "spawn[0]: 'gate' must be an integer"),
    ([{"id": "a", "gate": 2**31, "data": 1}], "spawn[0]: 'gate' must be an integer"),
    ([{"id": "a", "data": 1}, {"id": "b"}], "spawn[1]: a new item needs its content"),
    ([{"id": "a", "data_b64": "!!"}], "spawn[0]: 'data_b64' is not valid base64"),
    ([{"id": "a", "data_b64": 5}], "spawn[0]: 'data_b64' must be a base64 string"),
    ([{"id": "a", "data": "\ud800"}], "spawn[0]: 'data' contains an unpaired"),
])
def test_the_processor_refuses_malformed_spawns(value: object, message: str) -> None:
    with pytest.raises(MalformedResponseError) as raised:
        parse_spawn(value)
    assert message in str(raised.value)


def test_a_null_spawn_is_no_spawn_and_an_empty_one_too() -> None:
    assert parse_answer({"done": True, "spawn": None}) == Result(done=True)
    assert parse_answer({"done": True, "spawn": []}) == Result(done=True)


def test_a_fold_page_may_not_spawn_and_reduce_item_answers_may_not_either() -> None:
    def call(pass_: str) -> ReduceCall:
        return ReduceCall("p", 1, 1, pass_, 0, False, (), None, "k")

    fold = read_reduce_reply(Reply(200, None, json.dumps(
        {"accumulator": 1, "spawn": [{"id": "a", "data": 1}]}).encode()), call("fold"),
        max_bytes=10**6)
    assert "a fold page may not spawn" in getattr(fold, "reason", "")
    item = read_reduce_reply(Reply(200, None, json.dumps(
        {"items": {"x": {"done": True, "spawn": [{"id": "a", "data": 1}]}}}).encode()),
        call("apply"), max_bytes=10**6)
    assert "spawn from the answer's top-level 'spawn'" in getattr(item, "reason", "")
    applied = read_reduce_reply(Reply(200, None, json.dumps(
        {"spawn": [{"id": "a", "data": 1, "gate": 4}]}).encode()), call("all"),
        max_bytes=10**6)
    assert getattr(applied, "spawn", None) == (NewItem("a", b"1", 4),)
