"""How the CLI answers a person: -h on every verb, one line for a bad option value, verbs
(not library calls) named in errors, and migrate saying what it did with the URL as
given. The real ``processor`` executable, as subprocesses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.harness.processes import run_cli


def verbs() -> list[tuple[str, ...]]:
    """Every verb and sub-verb, as ``processor -h`` and ``processor keys -h`` list them."""
    from typer.main import get_command

    from processor.cli import app

    command = get_command(app)
    found: list[tuple[str, ...]] = [()]
    for name, sub in command.commands.items():  # type: ignore[attr-defined]
        found.append((name,))
        found += [(name, inner) for inner in getattr(sub, "commands", {})]
    return found


@pytest.mark.parametrize("verb", verbs(), ids=lambda verb: " ".join(verb) or "processor")
def test_dash_h_is_help_on_every_verb(verb: tuple[str, ...]) -> None:
    short, long = run_cli(*verb, "-h"), run_cli(*verb, "--help")
    assert short.returncode == 0, short.stderr
    assert short.stdout == long.stdout and short.stdout.startswith("Usage: processor")
    assert "-h, --help" in short.stdout


@pytest.mark.parametrize(("args", "words"), [
    (("create", "p", "--priority", "high"), ("--priority", "'high'", "create --help")),
    (("status", "--limit", "many"), ("--limit", "'many'", "status --help")),
    (("items", "p", "--gate", "1.5"), ("--gate", "'1.5'", "items --help")),
    (("create", "--no-such-option"), ("--no-such-option", "create --help")),
    (("keys", "set"), ("key", "keys set --help")),
])
def test_a_bad_option_is_one_line(args: tuple[str, ...], words: tuple[str, ...]) -> None:
    done = run_cli(*args, "--db-url", "sqlite:///never-made.db")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("processor: error: ") and "Usage:" not in done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)


def test_errors_name_the_verb_to_run_and_migrate_says_what_it_did(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'u.db'}"
    first = run_cli("migrate", "--db-url", url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"created statefeed's tables in {url} at revision ")
    again = run_cli("migrate", "--db-url", url)
    assert again.stdout.startswith(f"statefeed's tables are up to date in {url} (revision ")
    assert "aiosqlite" not in first.stdout + again.stdout
    for verb in (("pause", "no such"), ("cancel", "no such"), ("result", "no such"),
                 ("items", "no such")):
        done = run_cli(*verb, "--db-url", url)
        assert done.returncode == 2, done
        assert "`processor create 'no such' --items FILE`" in done.stderr, done.stderr
        assert "create_partition()" not in done.stderr


def test_pausing_a_finished_partition_is_refused_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    assert run_cli("migrate", "--db-url", url).returncode == 0
    items = tmp_path / "items.ndjson"
    items.write_text('{"id": "a", "data": 1}\n')
    assert run_cli("create", "p", "--items", str(items), "--db-url", url).returncode == 0
    assert run_cli("cancel", "p", "--db-url", url).returncode == 0
    done = run_cli("pause", "p", "--db-url", url)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("processor: error: partition 'p' is cancelled: nothing of it runs, "
                           "so there is nothing to pause (a retry or an add re-opens it; "
                           "pause it then)\n")
