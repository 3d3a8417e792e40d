"""The docs: the tutorial's first pipeline runs for real, the README shows the same code,
the site builds with ``mkdocs build --strict``, and the README's links lead somewhere.

The tutorial (docs/tutorial/first-pipeline.md) marks its runnable blocks with an HTML
comment before the fence, ``<!-- test: NAME -->``: ``handler`` (wordcount.py), ``serve``
(the uvicorn line), ``commands`` (``processor migrate`` and ``processor run``), ``client``
(pipeline.py) and ``output`` (what pipeline.py prints). The README's first pipeline carries
the same marks and must show the same code.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.harness.processes import run_cli, spawn

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TUTORIAL = ROOT / "docs" / "tutorial" / "first-pipeline.md"
MARKED = re.compile(r"<!-- test: (\w+) -->\n```[\w-]*\n(.*?)```", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
TUTORIAL_PORT = "8000"


def marked_blocks(path: Path) -> dict[str, str]:
    """The blocks of ``path`` marked ``<!-- test: NAME -->``, by name."""
    blocks: dict[str, str] = {}
    for name, code in MARKED.findall(path.read_text(encoding="utf-8")):
        assert name not in blocks, f"{path.name}: two blocks marked {name!r}"
        blocks[name] = code
    return blocks


def command_lines(block: str) -> list[list[str]]:
    """A shell block's commands, split as the shell would (no comments, no blanks)."""
    return [shlex.split(line, comments=True) for line in block.splitlines()
            if shlex.split(line, comments=True)]


def test_the_readme_shows_the_tutorials_pipeline() -> None:
    tutorial, readme = marked_blocks(TUTORIAL), marked_blocks(README)
    for name in ("handler", "client", "output"):
        assert readme.get(name) == tutorial[name], f"the README's {name} block differs"
    # The README runs the same commands from the virtual environment's bin folder.
    unprefixed = [[word.removeprefix(".venv/bin/") for word in command]
                  for command in command_lines(readme["commands"])]
    expected = command_lines(tutorial["serve"]) + command_lines(tutorial["commands"])
    assert unprefixed == expected


async def test_the_tutorials_first_pipeline_runs(tmp_path, monkeypatch) -> None:
    """Serve the tutorial's handler, run its commands and its client, in a fresh folder
    (its SQLite file is relative), and get the output the tutorial shows."""
    blocks = marked_blocks(TUTORIAL)
    (tmp_path / "wordcount.py").write_text(blocks["handler"], encoding="utf-8")
    (tmp_path / "pipeline.py").write_text(blocks["client"], encoding="utf-8")
    monkeypatch.chdir(tmp_path)

    [serve] = command_lines(blocks["serve"])
    assert serve[:2] == ["uvicorn", "wordcount:app"] and serve[-2:] == ["--port", TUTORIAL_PORT]
    spec = importlib.util.spec_from_file_location("tutorial_wordcount", tmp_path / "wordcount.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    from tests.support.servers import serve_app  # uvicorn: imported where it is used

    migrate, run = command_lines(blocks["commands"])
    assert migrate[:2] == ["processor", "migrate"] and run[:2] == ["processor", "run"]
    async with serve_app(module.app) as base_url:
        port = base_url.rsplit(":", 1)[1]
        run = [word.replace(f":{TUTORIAL_PORT}/", f":{port}/") for word in run]
        done = await asyncio.to_thread(run_cli, *migrate[1:])
        assert done.returncode == 0, done.stderr
        proc = await spawn("tutorial", [*run[1:], "--health-port", "0"], tmp_path)
        try:
            client = await asyncio.create_subprocess_exec(
                sys.executable, "pipeline.py", cwd=tmp_path,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = await asyncio.wait_for(client.communicate(), timeout=60)
            assert client.returncode == 0, (err.decode(), proc.stderr())
        finally:
            code = await proc.terminate()
    assert code == 0, proc.stderr()
    assert "Traceback" not in proc.stderr()
    assert out.decode() == blocks["output"]


def test_the_docs_build_strictly(tmp_path) -> None:
    """``mkdocs build --strict``, as .ci/run does: a broken link or anchor fails it."""
    missing = [name for name in ("mkdocs", "material") if importlib.util.find_spec(name) is None]
    if missing:
        message = (f"{' and '.join(missing)} not installed: "
                   "pip install -e '.[docs]' to build the docs")
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must build the docs", pytrace=False)
        pytest.skip(message)
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "tutorial" / "first-pipeline" / "index.html").exists()


def _slug(heading: str) -> str:
    """A heading's anchor, as MkDocs' ``toc`` makes it (for the headings we write)."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(heading) for heading in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_every_relative_link_in_the_readme_leads_somewhere() -> None:
    text = re.sub(r"```.*?```", "", README.read_text(encoding="utf-8"), flags=re.S)
    links = [link for link in LINK.findall(text)
             if not re.match(r"^[a-z][a-z0-9+.-]*:", link) and not link.startswith("#")]
    assert links, "the README links nowhere"
    broken = []
    for link in links:
        target, _, anchor = link.partition("#")
        path = ROOT / target
        if not path.exists():
            broken.append(f"{link}: no file {target}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {target}")
    assert not broken, "\n".join(broken)


async def test_the_library_mode_example_prints_what_it_says(tmp_path) -> None:
    """The client reference's library-mode script, run as it stands (its SQLite file is
    relative, so in a fresh folder), prints what its comment says."""
    code = marked_blocks(ROOT / "docs" / "reference" / "client.md")["library"]
    [expected] = re.findall(r"^\s*print\(.*?\)\s*# (.+)$", code, re.M)
    (tmp_path / "library.py").write_text(code, encoding="utf-8")
    script = await asyncio.create_subprocess_exec(
        sys.executable, "library.py", cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(script.communicate(), timeout=120)
    assert script.returncode == 0, err.decode()[-3000:]
    assert out.decode().strip() == expected.strip()


async def test_the_follow_example_ends_as_it_says(tmp_path) -> None:
    """The live feed page's Python example, run as it stands in a fresh folder: it
    follows its partition through its gate move to the end its comment names."""
    code = marked_blocks(ROOT / "docs" / "how-to" / "live-feed.md")["follow"]
    [expected] = re.findall(r"^\s*print\(.*?\)\s*# (.+)$", code, re.M)
    (tmp_path / "follow.py").write_text(code, encoding="utf-8")
    script = await asyncio.create_subprocess_exec(
        sys.executable, "follow.py", cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(script.communicate(), timeout=120)
    assert script.returncode == 0, err.decode()[-3000:]
    lines = out.decode().strip().splitlines()
    assert lines[-1] == expected.strip()
    assert lines.count(expected.strip()) == 1, "it stops after the end"
    assert any(line.startswith("items: ") for line in lines)


async def test_the_curl_check_gets_the_answer_shown_from_the_sdk_example(tmp_path) -> None:
    """The contract page's curl request, sent to the SDK page's ranker.py, gets the answer
    the contract page shows."""
    from tests.support.servers import serve_app  # uvicorn: imported where it is used

    ranker = marked_blocks(ROOT / "docs" / "reference" / "handler-sdk.md")["ranker"]
    (tmp_path / "ranker.py").write_text(ranker, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("docs_ranker", tmp_path / "ranker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    block = marked_blocks(ROOT / "docs" / "reference" / "http-contract.md")["curl"]
    command, expected = block.replace("\\\n", " ").strip().split("\n# ")
    words = shlex.split(command)
    assert words[:4] == ["curl", "-s", "-X", "POST"]
    url = words[4]
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    body = words[words.index("--data-binary") + 1].encode()

    import httpx

    async with serve_app(module.app) as base_url, httpx.AsyncClient() as client:
        answer = await client.post(url.replace("http://localhost:8000", base_url),
                                   headers=headers, content=body)
    assert answer.status_code == 200, answer.text
    assert answer.text == expected.strip()
