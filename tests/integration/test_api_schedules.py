"""The ingest API's schedule routes on a real uvicorn server, on every database: add,
list, read, pause, resume and delete, each answer checked against the OpenAPI document;
bad input refused with nothing written; and the API token guards them as it guards the
partition routes."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import httpx
import jsonschema_rs

from processor.api.server import ApiOptions, api_running
from watcher.store.db.urls import parse_database_url

TOKEN = "a-token-of-32-characters-at-least"
DOCUMENT = json.loads(files("processor.api").joinpath("openapi.json").read_text())


def conforms(response: httpx.Response, path: str, method: str) -> Any:
    """The body, after checking that the document lists its status and that it matches
    the documented schema."""
    responses = DOCUMENT["paths"][path][method]["responses"]
    documented = responses[str(response.status_code)]
    if "$ref" in documented:
        documented = DOCUMENT["components"]["responses"][documented["$ref"].rsplit("/", 1)[1]]
    schema = {**documented["content"]["application/json"]["schema"],
              "components": DOCUMENT["components"]}
    body = response.json()
    jsonschema_rs.validator_for(schema).validate(body)
    return body


async def test_schedule_routes(db_url: str, table_prefix: str) -> None:
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0)
    async with api_running(options) as url, httpx.AsyncClient(base_url=url) as http:
        one = "/v1/schedules/{name}"
        body = {"cron": "0 3 * * *", "timezone": "Europe/Berlin", "catch_up": "all",
                "no_overlap": True, "items": [{"id": "a", "data": {"n": 1}}],
                "reduce_gates": [1], "key": "acme", "priority": 2}
        added = await http.put("v1/schedules/nightly", json=body)
        assert added.status_code == 201, added.text
        assert added.headers["location"] == "/v1/schedules/nightly"
        shown = conforms(added, one, "put")
        assert (shown["cron"], shown["timezone"], shown["catch_up"], shown["items"]) == (
            "0 3 * * *", "Europe/Berlin", "all", 1)
        assert shown["next_tick"].endswith(":00:00Z") and shown["last_tick"] is None
        again = await http.put("v1/schedules/nightly", json={"every": 60})
        assert again.status_code == 409
        assert conforms(again, one, "put")["error"]["code"] == "schedule_exists"
        assert (await http.put("v1/schedules/fast", json={"every": 5})).status_code == 201

        listed = await http.get("v1/schedules", params={"limit": 1})
        page = conforms(listed, "/v1/schedules", "get")
        assert [row["name"] for row in page["schedules"]] == ["fast"]
        rest = conforms(await http.get("v1/schedules", params={"after": page["next_cursor"]}),
                        "/v1/schedules", "get")
        assert [row["name"] for row in rest["schedules"]] == ["nightly"]
        assert rest["schedules"][0] == shown

        paused = conforms(await http.post("v1/schedules/fast/pause"),
                          one + "/pause", "post")
        assert paused["paused"] is True and paused["schedule"]["next_tick"] is None
        assert conforms(await http.post("v1/schedules/fast/pause"),
                        one + "/pause", "post")["paused"] is False
        resumed = conforms(await http.post("v1/schedules/fast/resume"),
                           one + "/resume", "post")
        assert resumed["resumed"] is True and resumed["schedule"]["next_tick"] is not None
        deleted = conforms(await http.delete("v1/schedules/fast"), one, "delete")
        assert deleted == {"name": "fast", "deleted": True}
        missing = await http.get("v1/schedules/fast")
        assert missing.status_code == 404
        assert conforms(missing, one, "get")["error"]["code"] == "schedule_not_found"

        for name, bad, status in [
            ("x", {"cron": "0 3 * *"}, 422),
            ("x", {"cron": "0 3 * * *", "timezone": "No/Where"}, 422),
            ("x", {"every": 0.5}, 422), ("x", {}, 422), ("x", {"every": "1s"}, 400),
            ("x", {"every": 60, "catch_up": "most"}, 422), ("x", {"every": 60, "when": 1}, 400),
            ("a%2Fb", {"every": 60}, 422), ("x", {"every": 60, "no_overlap": "yes"}, 400),
        ]:
            refused = await http.put(f"v1/schedules/{name}", json=bad)
            assert refused.status_code == status, (bad, refused.text)
            conforms(refused, one, "put")
        assert (await http.patch("v1/schedules/nightly")).headers["allow"] == "DELETE, GET, PUT"
        final = conforms(await http.get("v1/schedules"), "/v1/schedules", "get")
        assert [row["name"] for row in final["schedules"]] == ["nightly"]


async def test_the_token_guards_the_schedule_routes(db_url: str, table_prefix: str) -> None:
    options = ApiOptions(parse_database_url(db_url), table_prefix, port=0, token=TOKEN)
    async with api_running(options) as url, httpx.AsyncClient(base_url=url) as http:
        refused = await http.put("v1/schedules/x", json={"every": 60})
        assert refused.status_code == 401
        assert (await http.get("v1/schedules")).status_code == 401
        allowed = await http.get("v1/schedules",
                                 headers={"authorization": f"Bearer {TOKEN}"})
        assert allowed.status_code == 200 and allowed.json()["schedules"] == []
