"""The error for ids a PAD SPACE collation takes for one names that rule."""

from __future__ import annotations

from watcher.errors import DuplicateItemError, pad_space_rule
from watcher.rules.spawn import SpawnConflictError


def test_ids_that_differ_in_trailing_spaces_name_the_collation_rule() -> None:
    for error in (DuplicateItemError("p", ["t", "t "], stored=False),
                  SpawnConflictError("p", "parent", ["t", "t "])):
        assert "ignores trailing spaces" in str(error) and "PAD SPACE" in str(error)


def test_other_collisions_do_not_mention_it() -> None:
    assert pad_space_rule(["a", "b"]) == ""
    assert "PAD SPACE" not in str(SpawnConflictError("p", None, ["taken"]))
