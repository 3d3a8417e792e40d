"""The approval flow end to end in a few seconds, on a throwaway SQLite database.

    python examples/approval_walkthrough.py

It serves the approval handler (``handlers/examples/approval.py``) and
``processor api`` on loopback, runs a processor that calls the handler, and adds
one partition of five contracts. Each contract parks at gate 0 and its approver
gets a completion link (the handler logs it, as it would send an e-mail). Then
the approvers answer: four approve, one rejects, each by ``POST``-ing to their
link, as the approval page would. The gate passes once the last one answers, and
gate 1 files every contract. Exit status 0 when the partition completed with
four contracts signed and one returned.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import httpx

from handlers.examples import approval
from processor import AsyncClient, NewItem
from processor.api.server import ApiOptions, api_running
from processor.embedded import http_url, listen, serving
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from watcher import Store, Watcher, WatcherConfig
from watcher.store.db.migrate import upgrade
from watcher.store.db.urls import parse_database_url

CONTRACTS = {"c1": "ada", "c2": "grace", "c3": "edsger", "c4": "barbara", "c5": "alan"}
REJECTED = "c4"


async def walkthrough() -> int:
    """Run the flow; returns the exit status."""
    with tempfile.TemporaryDirectory(prefix="statefeed-approval-") as folder:
        db_url = f"sqlite:///{Path(folder) / 'approval.db'}"
        await asyncio.to_thread(upgrade, db_url)
        handler_sock = listen("127.0.0.1", 0)
        options = ApiOptions(parse_database_url(db_url), port=0)
        async with api_running(options) as api, \
                serving(approval.app, handler_sock, what="the approval handler"), \
                AsyncClient(db_url) as client, httpx.AsyncClient(timeout=30) as http:
            os.environ["APPROVAL_API_URL"] = api
            handler = http_url("127.0.0.1", handler_sock.getsockname()[1])
            processor = HttpProcessor(HttpProcessorConfig(handler_url=handler))
            watcher = Watcher(Store.open(db_url), processor, WatcherConfig(
                owner_id="approval", poll_interval=0.05, lease_duration=5.0))
            task = asyncio.create_task(watcher.run())
            try:
                await client.create_partition("contracts", [
                    NewItem(cid, f'{{"approver": "{who}"}}'.encode())
                    for cid, who in CONTRACTS.items()])
                print("5 contracts added; each asks its approver (gate 0)")
                async with asyncio.timeout(30):
                    while True:
                        statuses = {item.status for item in await client.items("contracts")}
                        parked = (statuses == {"waiting"}
                                  and len(approval.LINKS) == len(CONTRACTS))
                        if parked and not (await client.partition("contracts")).owner:
                            break  # every contract waits, and the lease was let go
                        assert "failed" not in statuses, "the handler failed a contract"
                        await asyncio.sleep(0.05)
                info = await client.partition("contracts")
                print(f"all parked: {info.counts}, gate {info.gate}, lease owner "
                      f"{info.owner or '(none: let go while they wait)'}")
                for cid, link in sorted(approval.LINKS.items()):
                    approved = cid != REJECTED
                    answer = await http.post(link, json={"gate": 1,
                                                         "data": {"approved": approved}})
                    print(f"{CONTRACTS[cid]} {'approves' if approved else 'rejects'} {cid}: "
                          f"{answer.status_code} {answer.json()['status']} at gate "
                          f"{answer.json()['gate']}")
                    again = await http.post(link, json={"gate": 1})
                    assert again.status_code == 409, again.text  # a link works once
                done = await client.wait("contracts", timeout=30)
                filed = {item.id: json.loads(item.data or b"{}").get("filed")
                         for item in await client.items("contracts")}
            finally:
                await watcher.stop()
                await task
                await processor.aclose()
    print(f"the gate passed; partition {done.status}: {dict(sorted(filed.items()))}")
    signed = sum(value == "signed" for value in filed.values())
    ok = done.status == "complete" and signed == 4 and filed[REJECTED] == "returned"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(walkthrough()))
