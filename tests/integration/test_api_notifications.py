"""The ingest API's notification routes on a real uvicorn server, on every database: the
list with each filter and its pages, answered as ``processor notifications list --json``
prints events, each answer checked against the OpenAPI document; a dead event sent
again and pending; bad input refused (400, the field named) with nothing changed; the
API token guards both routes; and no answer holds the signing secret or a URL's
password or query value."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.notify.events import event_row
from tests.integration.test_api_schedules import TOKEN, conforms
from tests.integration.test_console_notifications import SECRET, one_dead_one_delivered
from watcher.errors import InvalidInputError
from watcher.store import Store
from watcher.store.db.urls import parse_database_url

LIST = "/v1/notifications"
REDELIVER = "/v1/notifications/redeliver"
# The fields `processor notifications list --json` prints for an event.
CLI_FIELDS = {"seq", "id", "partition_id", "status", "state", "attempts", "target",
              "ended_at", "next_at", "updated_at", "last_error"}
SECRETS = ("pw5ecret", "t0ps3cret", SECRET.decode())


@pytest.fixture
async def client(db_url: str, table_prefix: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(db_url, table_prefix) as opened:
        yield opened


@pytest.fixture
async def outbox(client: AsyncClient, store: Store) -> dict[str, int]:
    """Three events, by partition: "gone" dead (its URL with a password and a query
    value), "fine" delivered, "later" pending (no deliverer runs after the first two)."""
    dead = await one_dead_one_delivered(client, store)
    await client.create_partition("later", [NewItem("a", b"")],
                                  notify="https://hooks.example.com/later?sig=s3cr3tsig")
    await client.cancel("later")
    seqs = {event.partition_id: event.seq for event in await client.notifications()}
    assert seqs["gone"] == dead and len(seqs) == 3
    return seqs


@pytest.fixture
async def api(db_url: str, table_prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    async with api_running(options) as url, httpx.AsyncClient(base_url=url) as http:
        yield http


def unmasked(text: str) -> list[str]:
    """The secrets ``text`` shows."""
    return [secret for secret in (*SECRETS, "s3cr3tsig") if secret in text]


async def listed(api: httpx.AsyncClient, **query: object) -> dict[str, object]:
    response = await api.get(LIST.lstrip("/"), params=query)
    assert response.status_code == 200, response.text
    assert unmasked(response.text) == []
    return conforms(response, LIST, "get")


async def test_the_list_and_its_filters(api: httpx.AsyncClient, client: AsyncClient,
                                        outbox: dict[str, int]) -> None:
    everything = await listed(api)
    events = everything["events"]
    assert isinstance(events, list)
    # As the CLI's --json prints them (the same function, the same fields), in order.
    assert events == [event_row(event) for event in await client.notifications()]
    assert all(set(event) == CLI_FIELDS for event in events)
    assert [event["partition_id"] for event in events] == ["gone", "fine", "later"]
    assert everything["counts"] == {"pending": 1, "dead": 1, "due": 1}
    assert everything["next_cursor"] is None
    gone = events[0]
    assert gone["target"].startswith("http://ops:***@127.0.0.1:")
    assert gone["target"].endswith("/h?token=***")
    assert (gone["state"], gone["status"], gone["attempts"]) == ("dead", "cancelled", 1)
    assert gone["last_error"] == "HTTP 410: {\"ok\": false}" and gone["next_at"] is None
    assert events[2]["target"] == "https://hooks.example.com/later?sig=***"
    assert events[2]["next_at"] is not None

    for state, partition in (("dead", "gone"), ("delivered", "fine"), ("pending", "later")):
        page = await listed(api, state=state)
        assert [event["partition_id"] for event in page["events"]] == [partition], state
        page = await listed(api, partition=partition)
        assert [event["seq"] for event in page["events"]] == [outbox[partition]]
    assert (await listed(api, partition="gone", state="delivered"))["events"] == []
    assert (await listed(api, partition="nobody"))["events"] == []

    first = await listed(api, limit=2)
    assert [event["partition_id"] for event in first["events"]] == ["gone", "fine"]
    assert first["next_cursor"] == outbox["fine"]
    rest = await listed(api, limit=2, after=first["next_cursor"])
    assert [event["partition_id"] for event in rest["events"]] == ["later"]
    assert rest["next_cursor"] is None
    assert (await listed(api, after=outbox["later"]))["events"] == []


async def test_a_dead_event_is_sent_again(api: httpx.AsyncClient, client: AsyncClient,
                                          outbox: dict[str, int]) -> None:
    dead = outbox["gone"]
    sent = await api.post(REDELIVER.lstrip("/"), json={"seqs": [dead]})
    assert sent.status_code == 200, sent.text
    assert conforms(sent, REDELIVER, "post") == {"redelivered": 1, "requested": 1}
    (event,) = await client.notifications(partition_id="gone")
    assert (event.state, event.attempts) == ("pending", 0)
    page = await listed(api, state="pending")
    assert [event["seq"] for event in page["events"]] == [dead, outbox["later"]]
    assert page["counts"]["dead"] == 0

    # Not dead (pending again, delivered, pending from the start) or no such event: left
    # as they are, and not counted.
    before = [event_row(event) for event in await client.notifications()]
    again = await api.post(REDELIVER.lstrip("/"), json={
        "seqs": [dead, outbox["fine"], outbox["later"], 2_147_483_647]})
    assert conforms(again, REDELIVER, "post") == {"redelivered": 0, "requested": 4}
    assert [event_row(event) for event in await client.notifications()] == before
    none = await api.post(REDELIVER.lstrip("/"), json={"seqs": []})
    assert conforms(none, REDELIVER, "post") == {"redelivered": 0, "requested": 0}


LIST_REFUSALS = [
    ({"state": "lost"}, "state", "state must be one of pending, delivered, dead"),
    ({"state": ""}, "state", "state must be one of"),
    ({"partition": ""}, "partition", "partition id must be a non-empty string"),
    ({"partition": "x" * 256}, "partition", "the limit is 255"),
    ({"partition": "a\x00b"}, "partition", "NUL"),
    ({"limit": "0"}, "limit", "limit must be a whole number from 1 to 1000"),
    ({"limit": "1001"}, "limit", "from 1 to 1000"),
    ({"after": "-1"}, "after", "after must be a whole number from 0 to 2147483647"),
    ({"after": "2147483648"}, "after", "from 0 to 2147483647"),
    ({"after": "1.5"}, "after", "whole number"),
    ({"status": "dead"}, "status", "unknown query parameter 'status'"),
]
REDELIVER_REFUSALS = [
    (b'{"seqs": [1]', "seqs", None, "JSON"),
    (b"[1, 2]", None, None, "JSON object"),
    (b"{}", "seqs", "seqs", "the body needs 'seqs'"),
    (b'{"seqs": 12}', "seqs", "seqs", "must be a list of whole numbers"),
    (b'{"seqs": "12"}', "seqs", "seqs", "must be a list of whole numbers"),
    (b'{"seqs": {"12": 1}}', "seqs", "seqs", "must be a list of whole numbers"),
    (b'{"seqs": [true]}', "seqs", "seqs", "whole numbers from 1 to 2147483647, got True"),
    (b'{"seqs": [1.0]}', "seqs", "seqs", "got 1.0"),
    (b'{"seqs": ["1"]}', "seqs", "seqs", "got '1'"),
    (b'{"seqs": [0]}', "seqs", "seqs", "got 0"),
    (b'{"seqs": [2147483648]}', "seqs", "seqs", "got 2147483648"),
    (b'{"seqs": [1], "seq": [2]}', "seq", "seq", "unknown field 'seq'"),
    (b'{"seqs": [1], "seqs": [2]}', "seqs", "seqs", "key 'seqs' twice"),
]


async def test_bad_input_is_one_clear_refusal_and_changes_nothing(
        api: httpx.AsyncClient, client: AsyncClient, outbox: dict[str, int]) -> None:
    for query, field, says in LIST_REFUSALS:
        refused = await api.get(LIST.lstrip("/"), params=query)
        assert refused.status_code == 400, (query, refused.text)
        error = conforms(refused, LIST, "get")["error"]
        assert (error["code"], error["field"]) == ("bad_request", field), query
        assert says in error["message"], (query, error["message"])
    twice = await api.get(LIST.lstrip("/") + "?state=dead&state=pending")
    assert twice.status_code == 400 and twice.json()["error"]["field"] == "state"
    with pytest.raises(InvalidInputError, match="after must be a whole number"):
        await client.notifications(after=2**31)  # the client refuses it as the API does

    before = [event_row(event) for event in await client.notifications()]
    dead = str(outbox["gone"]).encode()
    json_type = {"content-type": "application/json"}
    for body, name, field, says in REDELIVER_REFUSALS:
        # Each refused body names the dead event too: it must stay dead.
        body = body.replace(b"[1]", b"[" + dead + b"]")
        refused = await api.post(REDELIVER.lstrip("/"), content=body, headers=json_type)
        assert refused.status_code == 400, (body, refused.text)
        error = conforms(refused, REDELIVER, "post")["error"]
        assert error["code"] == "bad_request" and error["field"] == field, (name, error)
        assert says in error["message"], (body, error["message"])
    too_many = await api.post(REDELIVER.lstrip("/"),
                              json={"seqs": [outbox["gone"], *range(2, 1002)]})
    assert too_many.status_code == 400
    assert "at most 1000" in conforms(too_many, REDELIVER, "post")["error"]["message"]
    for headers, status in (({"content-type": "text/plain"}, 415),
                            ({"content-type": "application/x-ndjson"}, 415),
                            ({"origin": "http://evil.example", **json_type}, 403)):
        refused = await api.post(REDELIVER.lstrip("/"), headers=headers,
                                 content=b'{"seqs": [' + dead + b"]}")
        assert refused.status_code == status, (headers, refused.text)
        conforms(refused, REDELIVER, "post")
    assert (await api.get(REDELIVER.lstrip("/"))).headers["allow"] == "POST"
    assert (await api.post(LIST.lstrip("/"), json={})).headers["allow"] == "GET"
    assert [event_row(event) for event in await client.notifications()] == before


async def test_the_token_guards_the_notification_routes(
        db_url: str, table_prefix: str, client: AsyncClient, outbox: dict[str, int]) -> None:
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0, token=TOKEN)
    async with api_running(options) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"seqs": [outbox["gone"]]}
        for refused in (await http.get(LIST.lstrip("/")),
                        await http.post(REDELIVER.lstrip("/"), json=body),
                        await http.get(LIST.lstrip("/"),
                                       headers={"authorization": "Bearer not-the-token"})):
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthorized"
        assert [event.seq for event in await client.notifications(state="dead")] == [
            outbox["gone"]]
        bearer = {"authorization": f"Bearer {TOKEN}"}
        allowed = await http.get(LIST.lstrip("/"), headers=bearer)
        assert allowed.status_code == 200 and len(allowed.json()["events"]) == 3
        assert unmasked(allowed.text) == [] and TOKEN not in allowed.text
        sent = await http.post(REDELIVER.lstrip("/"), json=body, headers=bearer)
        assert sent.json() == {"redelivered": 1, "requested": 1}
    assert await client.notifications(state="dead") == []
