"""The TypeScript SDK (``sdk/typescript``) installed and built once per checkout, for the
tests that run it: ``npm ci`` only when ``package-lock.json`` changed since the last
install, ``npm run build`` only when a source is newer than the last build, both under a
file lock: pytest-xdist workers neither install nor build into the same folder at once, nor
rewrite ``dist/`` under another worker's running ``npm test``."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "typescript"
NPM_TIMEOUT = 300


def npm_command() -> str:
    """The npm executable; skip without it, but fail under CI (``.ci/run`` installs it)."""
    npm = shutil.which("npm")
    if npm is None:
        message = "npm is not installed (Node.js 18 or later with npm runs the TypeScript SDK)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the TypeScript SDK's tests", pytrace=False)
        pytest.skip(message)
    return npm


def npm(*args: str, env: dict[str, str] | None = None, timeout: float = NPM_TIMEOUT) -> str:
    """Run ``npm args`` in the SDK's folder; fail the test with npm's output on error."""
    done = subprocess.run([npm_command(), *args], cwd=SDK, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    output = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"npm {' '.join(args)} exited with {done.returncode}:\n{output}",
                    pytrace=False)
    return output


def built_sdk() -> Path:
    """The SDK's folder with its dependencies installed and ``dist/`` and ``build/`` fresh."""
    npm_command()
    with (SDK / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        installed = SDK / "node_modules" / ".package-lock.json"
        lockfile = SDK / "package-lock.json"
        if not installed.exists() or installed.stat().st_mtime < lockfile.stat().st_mtime:
            npm("ci", "--no-audit", "--no-fund")
        stamp = SDK / "build" / ".built"
        sources = [path for folder in ("src", "test") for path in (SDK / folder).rglob("*.ts")]
        sources += [SDK / "package.json", SDK / "tsconfig.json", installed]
        newest = max(path.stat().st_mtime for path in sources)
        if not stamp.exists() or stamp.stat().st_mtime < newest:
            npm("run", "build")
            stamp.touch()
    return SDK
