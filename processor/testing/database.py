"""The test kit's throwaway SQLite databases: the migrations run once per process, into
a template file that each kit copies (Alembic takes seconds on a loaded machine; a copy
takes a millisecond)."""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
import threading
from pathlib import Path

from watcher.store.db.migrate import upgrade

_template: Path | None = None
# A thread's lock: kits of one process may run in different event loops.
_lock = threading.Lock()


def _migrated_template() -> Path:
    """The migrated template database of this process, made on first use."""
    global _template
    with _lock:
        if _template is None:
            folder = Path(tempfile.mkdtemp(prefix="statefeed-testkit-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            path = folder / "template.db"
            upgrade(f"sqlite:///{path}")
            _template = path
    return _template


def _copy_new(template: Path, path: Path) -> None:
    with template.open("rb") as source, path.open("xb") as copy:  # "x": never over a file
        shutil.copyfileobj(source, copy)


async def fresh_database(path: Path) -> str:
    """A migrated SQLite database at ``path`` (a copy of the template); returns its URL.

    Raises:
        FileExistsError: ``path`` exists already.
    """
    template = await asyncio.to_thread(_migrated_template)
    await asyncio.to_thread(_copy_new, template, path)
    return f"sqlite:///{path}"
