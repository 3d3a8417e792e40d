"""A human approval: each contract waits for a person to approve or reject it.

Gate 0 (``ask``) parks each contract for up to a week and "sends" its approver a
link, as an e-mail would: here one INFO log line with the completion URL, and the
URL kept in :data:`LINKS` for the walkthrough (``examples/approval_walkthrough.py``).
Whoever opens the link completes the wait with ``POST`` to it (an approval page
would): ``{"gate": 1, "data": {"approved": true}}``. The gate passes once every
contract is decided; gate 1 (``file``) files each one as approved or rejected.

Run it with ``uvicorn handlers.examples.approval:app`` and point a processor at
``http://127.0.0.1:8000/``; ``APPROVAL_API_URL`` is where ``processor api`` answers
(default ``http://127.0.0.1:8091``).
"""

from __future__ import annotations

import logging
import os

import handlers

log = logging.getLogger(__name__)

WEEK = 7 * 86400
# The completion links handed out, by contract id (the walkthrough reads them).
LINKS: dict[str, str] = {}


def api_url() -> str:
    """Where ``processor api`` answers completions."""
    return os.environ.get("APPROVAL_API_URL", "http://127.0.0.1:8091").rstrip("/")


def ask(item: handlers.Item) -> handlers.Result:
    """Park the contract and send its approver the completion link. Raises nothing."""
    contract = item.json() or {}
    link = f"{api_url()}/v1/completions/{item.completion_token}"
    LINKS[item.id] = link
    # The e-mail: in a real system, send_mail(contract["approver"], link).
    log.info("action=approval_asked contract=%s approver=%s", item.id,
             contract.get("approver", "?"))
    return handlers.Result(wait={"timeout": WEEK}, data={**contract, "asked": True})


def file(item: handlers.Item) -> handlers.Result:
    """File the decided contract: the completion wrote ``approved`` into its data."""
    contract = item.json() or {}
    contract["filed"] = "signed" if contract.get("approved") else "returned"
    return handlers.Result(done=True, data=contract)


app = handlers.app({0: ask, 1: file})

if __name__ == "__main__":
    handlers.serve(app)
