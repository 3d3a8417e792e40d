"""The container recipe: no Docker engine runs here, so replay its install steps in a venv."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Processor.Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            steps.append((keyword.upper(), rest.strip()))
    return steps


def test_dockerfile_shape() -> None:
    steps = dict(_instructions())
    assert steps["FROM"].startswith("python:3.11-slim")
    assert steps["USER"] and steps["USER"] != "root"
    assert steps["ENTRYPOINT"] == '["processor"]'
    assert steps["CMD"] == '["run"]'
    assert "/healthz" in steps["HEALTHCHECK"]


def test_dockerfile_install_steps_give_a_working_processor(tmp_path) -> None:
    """Copy what the Dockerfile copies, run its pip installs in a fresh venv, run the CLI."""
    app = tmp_path / "app"
    app.mkdir()
    installs = []
    for keyword, rest in _instructions():
        if keyword == "COPY":
            *sources, _target = shlex.split(rest)
            for source in sources:
                path = ROOT / source
                if path.is_dir():
                    shutil.copytree(path, app / source,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(path, app / path.name)
        elif keyword == "RUN" and re.match(r"pip install", rest):
            installs.append(shlex.split(rest))
    assert installs, "the Dockerfile installs the package with pip"
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    for command in installs:
        done = subprocess.run([str(python), "-m", *command], cwd=app, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    helped = subprocess.run([str(env_dir / "bin" / "processor"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "run" in helped.stdout and "migrate" in helped.stdout
    drivers = subprocess.run([str(python), "-c", "import psycopg, pymssql"],
                             capture_output=True, text=True, timeout=60)
    assert drivers.returncode == 0, drivers.stderr
    assert sys.version_info >= (3, 11)
