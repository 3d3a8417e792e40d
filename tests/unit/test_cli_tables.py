"""How wide the status table's id column is on a narrow terminal (a pure decision)."""

from __future__ import annotations

import pytest

from processor.cli.terminal import FOLD_MIN_WIDTH, ID_MIN_WIDTH, id_column_width


@pytest.mark.parametrize(("terminal", "longest", "fixed", "folding", "width"), [
    # 80 columns, status 9 and gate 7 never wrap, owner and items fold: 30 fits whole.
    (80, 30, [9, 7], 2, 30),
    # The room left (80 - 16 - 16 - 18 = 30) when the id is longer: it folds there.
    (80, 60, [9, 7], 2, 30),
    # A flow and a pipeline column too: less room, never under the least.
    (80, 60, [9, 7, 20], 3, ID_MIN_WIDTH),
    (200, 60, [9, 7], 2, 60),
    (40, 60, [9, 7], 2, ID_MIN_WIDTH),
])
def test_the_id_column_keeps_ids_whole_while_the_rest_can_fold(
        terminal: int, longest: int, fixed: list[int], folding: int, width: int) -> None:
    assert id_column_width(terminal, longest, fixed, folding) == width
    assert FOLD_MIN_WIDTH < ID_MIN_WIDTH  # an owner gives way before an id
