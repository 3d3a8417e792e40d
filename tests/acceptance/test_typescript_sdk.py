"""The TypeScript SDK (``sdk/typescript``) in the project's one test command: it installs,
builds, passes its own tests (Node's test runner; among them a spawn + park + reduce
pipeline, the batch protocol, a non-retryable error and ``Retry-After`` through a real
``processor run`` and ``processor api`` on throwaway SQLite, run by this venv's
``processor``), and packs for npm."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.typescript_sdk import built_sdk, npm

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]


def processor_bin() -> str:
    """This venv's ``processor``, the one whose code the tests check."""
    beside = Path(sys.executable).with_name("processor")
    command = str(beside) if beside.exists() else shutil.which("processor")
    assert command is not None, "the processor CLI is not installed: pip install -e ."
    return command


def test_the_typescript_sdk_passes_its_tests_against_a_real_processor() -> None:
    built_sdk()
    output = npm("test", env={"PROCESSOR_BIN": processor_bin()})
    # Skipped processor tests would pass quietly: the CLI must have been found.
    assert "# skipped 0" in output, output
    assert "# fail 0" in output, output


def test_the_typescript_sdk_packs_its_built_javascript_and_types() -> None:
    sdk = built_sdk()
    packed = json.loads(npm("pack", "--dry-run", "--json", "--ignore-scripts"))
    files = {entry["path"] for entry in packed[0]["files"]}
    manifest = json.loads((sdk / "package.json").read_text(encoding="utf-8"))
    for entry in manifest["exports"].values():
        targets = entry.values() if isinstance(entry, dict) else [entry]
        for target in targets:
            assert target.removeprefix("./") in files, f"{target} is exported but not packed"
    assert "dist/index.d.ts" in files and "README.md" in files
    assert not any(path.startswith(("src/", "test/", "build/", "node_modules/"))
                   for path in files), sorted(files)
