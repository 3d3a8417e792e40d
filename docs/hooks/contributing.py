"""MkDocs hook: CONTRIBUTING.md's links, written from the repository's root, work on the site.

``docs/contributing.md`` is a symbolic link to ``CONTRIBUTING.md``, so the page's text
is the root file's, whose links into the docs start with ``docs/``. On the site the
page sits inside ``docs/``, so those links lose that prefix here, before MkDocs checks
and converts them.
"""

from __future__ import annotations

import re
from typing import Any

PAGE = "contributing.md"
_DOCS_LINK = re.compile(r"\]\(docs/")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """The page's Markdown, with ``](docs/...)`` links made relative to ``docs/``."""
    if page.file.src_uri != PAGE:
        return markdown
    return _DOCS_LINK.sub("](", markdown)
