"""What ``--handler-url`` alone serves, as the code decides it and the docs say it: the
``default`` pipeline (every version and gate of it), not every place."""

from __future__ import annotations

from pathlib import Path

from processor.http.routes import single_route
from watcher.records import DEFAULT_PIPELINE

ROOT = Path(__file__).resolve().parents[2]


def test_handler_url_alone_serves_the_default_pipeline_only() -> None:
    served = single_route("http://127.0.0.1:8000/").served()
    assert served is not None, "not every place"
    assert served.serves(DEFAULT_PIPELINE, None, 0) and served.serves(DEFAULT_PIPELINE, "v9", 7)
    assert not served.serves("invoices", None, 0)


def test_no_page_says_handler_url_serves_every_place() -> None:
    wrong = [page.relative_to(ROOT).as_posix()
             for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
             if "every place, as `--handler-url`" in page.read_text(encoding="utf-8")]
    assert wrong == []
