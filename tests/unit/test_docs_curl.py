"""Every curl example in the docs that sends a body says its Content-Type: without
``-H 'content-type: application/json'`` (or NDJSON's), curl's ``-d`` sends a form's
type, which the ingest API refuses with 415 (its cross-site defence)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"```[\w-]*\n(.*?)```", re.S)
BODY_FLAGS = ("-d", "--data", "--data-binary", "--data-raw", "--data-urlencode", "-T",
              "--upload-file")


def curl_commands(text: str) -> list[str]:
    """The curl commands of ``text``'s fenced blocks, continuation lines joined."""
    commands = []
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("curl "):
                commands.append(line)
    return commands


def sends_a_body_without_its_type(command: str) -> bool:
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # a placeholder such as [...] the shell would not take
        words = command.split()
    sends = any(word in BODY_FLAGS or word.startswith(("--data=", "-d'", '-d"'))
                for word in words)
    if not sends or "--json" in words:  # curl's --json sets the type itself
        return False
    headers = [words[n + 1].strip("'\"").lower() for n, word in enumerate(words[:-1])
               if word in ("-H", "--header")]
    return not any(header.startswith("content-type:") for header in headers)


def test_the_checker_finds_a_body_without_its_type() -> None:
    assert sends_a_body_without_its_type(
        "curl -X POST \"$URL/heartbeat\" -d '{\"timeout\": 3600}'")
    assert not sends_a_body_without_its_type(
        "curl -X POST \"$URL\" -H 'content-type: application/json' -d '{}'")
    assert not sends_a_body_without_its_type("curl -X POST \"$URL/retry\"")


def test_every_curl_example_with_a_body_sends_its_content_type() -> None:
    found = [(page.relative_to(ROOT).as_posix(), command)
             for page in PAGES for command in curl_commands(page.read_text(encoding="utf-8"))
             if sends_a_body_without_its_type(command)]
    assert found == [], "add -H 'content-type: application/json' to: " + repr(found)
    assert sum(len(curl_commands(page.read_text(encoding="utf-8"))) for page in PAGES) > 10
