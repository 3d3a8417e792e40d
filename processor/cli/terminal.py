"""A Rich console that shows data as text: what the CLI and the demo print tables with.

Every string it renders, a table's cells and title included, passes through
:func:`processor.observe.safe_text.escape_controls` first, so an id, a key, an error text or
an item's data cannot retitle the terminal, clear it or recolour what follows; and,
unless asked, it reads no markup or emoji codes in them (``[bold]`` in an id is
printed as it is).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from processor.observe.safe_text import escape_controls


class SafeConsole(Console):
    """:class:`rich.console.Console` with control characters escaped in every string it
    renders, and no markup, emoji or highlighting unless given."""

    def __init__(self, **options: Any) -> None:
        for name in ("markup", "emoji", "highlight"):
            options.setdefault(name, False)
        super().__init__(**options)

    def render_str(self, text: str, **options: Any) -> Text:
        """``text`` as Rich's :class:`~rich.text.Text`, its control characters escaped
        before markup (if on) is read. Raises as Rich's does for bad markup."""
        return super().render_str(escape_controls(text), **options)
