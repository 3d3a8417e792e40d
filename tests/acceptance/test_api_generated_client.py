"""A client generated from the served OpenAPI document by a generator no one here wrote
(openapi-python-client, offline) works against ``processor api`` as a real subprocess:
its typed models are used for every answer, and it creates, reads, lists, waits for,
retries and pauses partitions, and sets keys' limits and the pause of everything.

openapi-typescript (npm) must turn the same document into types without an error:
CI installs it (.ci/run); elsewhere that check skips when it is not installed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.acceptance.test_api_upload import api_process, migrated  # noqa: F401

# Leave its output unformatted (its post hooks would run ruff from PATH).
GENERATOR_CONFIG = "post_hooks: []\n"
# What it says of the NDJSON bodies, which it knows no type for (it sends JSON bodies
# only; the NDJSON form is for streaming uploads, by hand). Mapping them to bytes
# (content_type_overrides) makes code that fails to import in 0.29: a missing import of
# Unset where a route has a body of two types and no query.
NDJSON_WARNING = "Unsupported content type application/x-ndjson"
GENERATE_TIMEOUT = 120
OPENAPI_TYPESCRIPT_ENV = "OPENAPI_TYPESCRIPT"


def generate(document: bytes, folder: Path) -> ModuleType:
    """The package openapi-python-client makes of ``document``, imported under a name
    of its own."""
    name = f"statefeed_generated_{uuid.uuid4().hex[:8]}"
    (folder / "openapi.json").write_bytes(document)
    (folder / "config.yaml").write_text(GENERATOR_CONFIG)
    done = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path",
         str(folder / "openapi.json"), "--output-path", str(folder / name), "--meta", "none",
         "--config", str(folder / "config.yaml")],
        capture_output=True, text=True, timeout=GENERATE_TIMEOUT, cwd=folder)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    # It warns of any schema or body it could not read, and then leaves it out.
    warnings = said.split("WARNING parsing ")[1:]
    assert all(NDJSON_WARNING in warning for warning in warnings), said
    assert len(warnings) == 2, said  # the NDJSON bodies of create and add
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


def part(package: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{package.__name__}.{name}")


def test_the_generator_makes_a_model_per_schema_and_one_error_class(tmp_path: Path) -> None:
    from processor.api.routes import OPENAPI

    package = generate(OPENAPI.read_bytes(), tmp_path)
    models = part(package, "models")
    for schema in ("Partition", "PartitionPage", "NewItem", "Item", "ItemPage", "Created",
                   "KeyControl", "KeyPage", "KeyLimitsRequest", "Fleet", "Error"):
        assert hasattr(models, schema), schema
    # One error shape, not a class per operation and status.
    errors = [name for name in dir(models) if "Error" in name or "Response4" in name]
    assert errors == ["Error", "ErrorDetail"], errors
    get = part(package, "api.partitions.get_partition")
    assert get._parse_response.__annotations__["return"] == (
        models.Error | models.Partition | None)


async def test_a_generated_client_drives_the_api(tmp_path: Path,
                                                 migrated: tuple[str, str]) -> None:  # noqa: F811
    db_url, prefix = migrated
    async with api_process(tmp_path, db_url, prefix) as (proc, url):
        async with httpx.AsyncClient() as fetching:
            document = (await fetching.get(url + "v1/openapi.json")).content
        package = generate(document, tmp_path)
        models = part(package, "models")
        api = {name: part(package, f"api.{name}") for name in (
            "partitions.create_partition", "partitions.get_partition",
            "partitions.list_partitions", "partitions.wait_for_partition",
            "items.add_items", "items.list_items", "operations.cancel_partition",
            "operations.retry_partition", "operations.pause_partition",
            "operations.resume_partition", "flow.set_key_limits", "flow.list_keys",
            "flow.pause_key", "flow.resume_key", "flow.get_fleet", "flow.pause_fleet",
            "flow.resume_fleet", "waits.complete_wait", "waits.heartbeat_wait")}
        with package.Client(base_url=url.rstrip("/"), raise_on_unexpected_status=True) \
                as client:
            def call(operation: str, *args: Any, **kwargs: Any) -> Any:
                return api[operation].sync(*args, client=client, **kwargs)

            # Create: JSON with typed items (data and bytes), then NDJSON with the query.
            items = [models.NewItem(id="a", data={"n": 1}),
                     models.NewItem(id="b", data_b64=base64.b64encode(b"\x00\x01").decode()),
                     models.NewItem(id="c", gate=1, data=None)]
            created = call("partitions.create_partition", "gen/1", body=models.CreateRequest(
                items=items, reduce_gates=[1], key="acme", priority=2),
                idempotency_key="gen-1")
            assert isinstance(created, models.Created)
            assert (created.items, created.key, created.priority) == (3, "acme", 2)
            # NDJSON through the generated client's own httpx client, with its model.
            sent = client.get_httpx_client().put(
                "/v1/partitions/gen%2F2", params={"key": "acme", "priority": -1},
                content=b'{"id": "x", "data": 1}\n{"id": "y", "data": 2}\n',
                headers={"content-type": "application/x-ndjson"})
            assert sent.status_code == 201, sent.text
            lines = models.Created.from_dict(sent.json())
            assert lines.items == 2
            assert lines.priority == -1
            both = call("partitions.create_partition", "gen/3",
                        body=models.CreateRequest(key="acme"), key="globex")
            assert isinstance(both, models.Error) and both.error.field == "key"

            # Read, list and page.
            partition = call("partitions.get_partition", "gen/1")
            assert isinstance(partition, models.Partition)
            assert partition.status == models.PartitionStatus.AVAILABLE
            assert partition.counts.additional_properties == {"available": 3}
            assert partition.result is None and partition.key == "acme"
            missing = call("partitions.get_partition", "gen/none")
            assert isinstance(missing, models.Error)
            assert missing.error.code == "partition_not_found"
            page = call("partitions.list_partitions", limit=1, prefix="gen/")
            assert isinstance(page, models.PartitionPage)
            assert [one.id for one in page.partitions] == ["gen/2"]  # newest first
            rest = call("partitions.list_partitions", after=page.next_cursor, prefix="gen/")
            assert [one.id for one in rest.partitions] == ["gen/1"]
            assert rest.next_cursor is None
            available = call("partitions.list_partitions",
                             status=models.PartitionStatus.CANCELLED)
            assert available.partitions == []
            listed = call("items.list_items", "gen/1", limit=10)
            assert isinstance(listed, models.ItemPage)
            assert [item.id for item in listed.items] == ["a", "b", "c"]
            assert listed.items[0].data == {"n": 1} and listed.items[1].data_b64 == "AAE="
            added = call("items.add_items", "gen/2",
                         body=models.AddRequest(items=[models.NewItem(id="z", data=[])]))
            assert isinstance(added, models.Added) and added.added == 1

            # Pause and resume a partition; wait; cancel; retry.
            paused = call("operations.pause_partition", "gen/1")
            assert isinstance(paused, models.Paused) and paused.paused is True
            resumed = call("operations.resume_partition", "gen/1")
            assert isinstance(resumed, models.Resumed) and resumed.resumed is True
            waited = api["partitions.wait_for_partition"].sync_detailed(
                "gen/1", client=client, timeout=0.1)
            assert waited.status_code == 202 and isinstance(waited.parsed, models.Partition)
            assert waited.parsed.finished is False
            cancelled = call("operations.cancel_partition", "gen/1")
            assert isinstance(cancelled, models.Cancelled) and cancelled.cancelled is True
            finished = call("partitions.wait_for_partition", "gen/1", timeout=5)
            assert isinstance(finished, models.Partition) and finished.finished is True
            retried = call("operations.retry_partition", "gen/1")
            assert isinstance(retried, models.RetryReport)
            assert retried.status_before == models.PartitionStatus.CANCELLED
            assert retried.reopened is True

            # Keys: limits, pause, listing; and the pause of everything.
            limits = call("flow.set_key_limits", "acme",
                          body=models.KeyLimitsRequest(max_inflight=3, rate_limit=2.5))
            assert isinstance(limits, models.KeyLimits)
            assert (limits.max_inflight, limits.rate_limit) == (3, 2.5)
            unknown = call("flow.set_key_limits", "nobody",
                           body=models.KeyLimitsRequest(max_inflight=1))
            assert isinstance(unknown, models.Error) and unknown.error.code == "key_not_found"
            defined = call("flow.set_key_limits", "nobody",
                           body=models.KeyLimitsRequest(max_inflight=1, define=True))
            assert isinstance(defined, models.KeyLimits)
            key_paused = call("flow.pause_key", "acme")
            assert isinstance(key_paused, models.KeyPaused) and key_paused.paused is True
            keys = call("flow.list_keys", limit=1)
            assert isinstance(keys, models.KeyPage)
            assert [key.key for key in keys.keys] == ["acme"]
            assert (keys.keys[0].max_inflight, keys.keys[0].paused) == (3, True)
            more = call("flow.list_keys", after=keys.next_cursor)
            assert [key.key for key in more.keys] == ["nobody"] and more.next_cursor is None
            assert call("flow.resume_key", "acme").resumed is True
            assert call("flow.get_fleet").paused is False
            fleet = call("flow.pause_fleet")
            assert isinstance(fleet, models.FleetPaused) and fleet.paused is True
            assert call("flow.get_fleet").paused_at == fleet.paused_at
            assert call("flow.pause_fleet").paused is False
            assert call("flow.resume_fleet").resumed is True
            assert call("flow.get_fleet").paused is False

            # A wait: an item parks (a library processor here), the generated client
            # moves its deadline and completes it, once.
            try:
                await _complete_a_wait(db_url, prefix, models, call)
            except Exception as error:
                raise AssertionError(f"the API said: {proc.stderr()[-3000:]}") from error


async def _complete_a_wait(db_url: str, prefix: str, models: Any, call_in_loop: Any) -> None:
    """Park an item with a processor in this event loop, and complete it with the
    generated client, whose blocking calls go to a thread: the processor's writes (a
    SQLite write transaction among them) go on meanwhile."""
    from processor import AsyncClient, NewItem
    from tests.integration.test_waits import Parker, config
    from tests.support.engine import running, wait_until
    from watcher import Watcher
    from watcher.store import Store

    async def call(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(call_in_loop, *args, **kwargs)

    parker = Parker()
    store = Store.open(db_url, prefix)
    async with AsyncClient(db_url, prefix) as library, contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.close)
        await library.create_partition("gen/wait", [NewItem("w", b"1")])
        async with running(Watcher(store, parker, config())):
            async def parked() -> bool:
                return len(await library.items("gen/wait", status="waiting")) == 1
            await wait_until(parked, message="the item parked")
            shown = await call("partitions.get_partition", "gen/wait")
            assert shown.waiting.by_gate.additional_properties == {"0": 1}
            token = parker.token("w")
            beat = await call("waits.heartbeat_wait", token,
                              body=models.HeartbeatRequest(timeout=60))
            assert isinstance(beat, models.Heartbeat)
            done = await call("waits.complete_wait", token,
                              body=models.CompletionRequest(gate=1, data={"ok": True}))
            assert isinstance(done, models.Completed)
            assert (done.item_id, done.gate) == ("w", 1)
            again = await call("waits.complete_wait", token, body=models.CompletionRequest())
            assert isinstance(again, models.Error)
            assert again.error.code == "already_completed"
            unknown = await call("waits.complete_wait", "C" * 43, body=models.CompletionRequest())
            assert isinstance(unknown, models.Error) and unknown.error.code == "not_found"


def openapi_typescript() -> str:
    """The openapi-typescript command: ``$OPENAPI_TYPESCRIPT`` or on PATH; skip (fail
    under CI) without it."""
    command = os.environ.get(OPENAPI_TYPESCRIPT_ENV) or shutil.which("openapi-typescript")
    if command is None:
        message = (f"openapi-typescript is not installed (npm install -g openapi-typescript, "
                   f"or set {OPENAPI_TYPESCRIPT_ENV} to its command)")
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must check the document with it", pytrace=False)
        pytest.skip(message)
    return command


def test_openapi_typescript_makes_types_of_the_document(tmp_path: Path) -> None:
    from processor.api.routes import OPENAPI

    command = openapi_typescript()
    (tmp_path / "openapi.json").write_bytes(OPENAPI.read_bytes())
    done = subprocess.run([command, str(tmp_path / "openapi.json"), "-o",
                           str(tmp_path / "api.d.ts")], capture_output=True, text=True,
                          timeout=GENERATE_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    types = (tmp_path / "api.d.ts").read_text()
    for schema in ("Partition", "NewItem", "KeyControl", "Error"):
        assert f"{schema}: {{" in types, schema
    assert '"/v1/partitions": {' in types and '"/v1/fleet/pause": {' in types
