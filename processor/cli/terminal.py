"""A Rich console that shows data as text: what the CLI and the demo print tables with.

Every string it renders, a table's cells and title included, passes through
:func:`processor.observe.safe_text.escape_controls` first, so an id, a key, an error text or
an item's data cannot retitle the terminal, clear it or recolour what follows; and,
unless asked, it reads no markup or emoji codes in them (``[bold]`` in an id is
printed as it is). :func:`id_column_width` decides how wide a table's id column is on
a terminal too narrow for the whole table.
"""

from __future__ import annotations

from collections.abc import Sequence
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


# The narrowest the id column gets before the other columns give way: an id folds in
# pieces this long at the least, not in 3-character ones.
ID_MIN_WIDTH = 16
# What a column that folds (an owner, the item counts, the flow) keeps at the least on a
# narrow terminal: the ids stay whole while the others fit beside them at this width.
FOLD_MIN_WIDTH = 9


def id_column_width(terminal: int, longest: int, fixed: Sequence[int], folding: int) -> int:
    """The width of the status table's id column on a terminal too narrow for the whole
    table: the longest id whole when the other columns fit beside it at their least
    (``fixed``: the widths of those that never wrap; ``folding``: how many fold, each
    down to :data:`FOLD_MIN_WIDTH`), else the room left, never under
    :data:`ID_MIN_WIDTH`. A table's borders and padding take 3 characters a column,
    and one more."""
    columns = 1 + len(fixed) + folding
    room = 3 * columns + 1 + sum(fixed) + folding * FOLD_MIN_WIDTH
    return max(min(longest, terminal - room), ID_MIN_WIDTH)
