"""The layout holds: imports point down, nothing imports in a circle, and no folder or
module outgrows its room. Read from the sources' own import statements (every one,
those inside functions and under ``TYPE_CHECKING`` included), so a new edge fails here
before it lands."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("watcher", "processor", "handlers")
# What each top-level package may import of the others.
ALLOWED = {"handlers": set(), "watcher": set(), "processor": {"watcher", "handlers"}}
# Within a package, folders from the bottom up: a folder imports only from folders
# below it (and from the package's shared top-level modules).
FOLDER_ORDER = {
    "watcher": ["rules", "schedules", "store", "flow", "leasing", "dispatch"],
    "processor": ["wire", "observe", "notify", "feed", "client", "http", "console", "api",
                  "cli"],
    "handlers": ["wire"],
}
MAX_MODULES_PER_FOLDER = 15
MAX_LINES_PER_MODULE = 400


def modules() -> dict[str, Path]:
    """Every module of the three packages by dotted name (migrations' revisions aside:
    Alembic loads them by path)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if ".migrations.versions" not in name:
                found[name] = path
    return found


MODULES = modules()


def resolve(name: str) -> str | None:
    """The module of this tree that ``name`` (a module, or a name in one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path) -> Iterator[str]:
    """The modules of this tree that ``path`` imports."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target is not None:
                yield target


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        edges[name].update(target for target in imports_of(path) if target != name)
    return edges


EDGES = graph()


def folder_of(module: str) -> str | None:
    """The concern folder a module lives in (``watcher.store.sql.leases`` -> ``store``),
    or ``None`` for a package's shared top-level modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and
                                           (MODULES[module].name == "__init__.py")) else None


def test_the_packages_import_only_downward() -> None:
    upward = [f"{source} -> {target}" for source, targets in sorted(EDGES.items())
              for target in sorted(targets)
              if target.split(".")[0] != source.split(".")[0]
              and target.split(".")[0] not in ALLOWED[source.split(".")[0]]]
    assert not upward, "imports that point up (pass what is needed in instead):\n" + \
        "\n".join(upward)


def test_folders_import_only_from_folders_below_them() -> None:
    wrong = []
    for source, targets in sorted(EDGES.items()):
        package, folder = source.split(".")[0], folder_of(source)
        order = FOLDER_ORDER[package]
        if folder not in order:
            continue
        for target in sorted(targets):
            if target.split(".")[0] != package:
                continue
            other = folder_of(target)
            if other in order and order.index(other) > order.index(folder):
                wrong.append(f"{source} ({folder}) -> {target} ({other})")
    assert not wrong, (f"folders import from above them; the order, bottom up: "
                       f"{FOLDER_ORDER}\n" + "\n".join(wrong))


def circles() -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in EDGES.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(MODULES):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert circles() == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_folder_holds_more_than_fifteen_modules(package: str) -> None:
    crowded = {}
    for folder in [ROOT / package, *(p for p in (ROOT / package).rglob("*") if p.is_dir())]:
        if "__pycache__" in folder.parts or "migrations" in folder.parts:
            continue
        count = sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")
        if count > MAX_MODULES_PER_FOLDER:
            crowded[str(folder.relative_to(ROOT))] = count
    assert not crowded, f"split these folders by concern: {crowded}"


def test_no_module_is_over_four_hundred_lines() -> None:
    long = {str(path.relative_to(ROOT)): lines for path in MODULES.values()
            if "migrations" not in path.parts
            and (lines := len(path.read_text(encoding="utf-8").splitlines()))
            > MAX_LINES_PER_MODULE}
    assert not long, f"split these modules by role: {long}"


def test_the_checks_see_the_tree() -> None:
    """The graph is read at all: a rule over an empty graph would pass for ever."""
    assert len(MODULES) > 100
    assert "watcher.store" in EDGES["watcher.watcher"] or any(
        target.startswith("watcher.store") for target in EDGES["watcher.watcher"])
    assert folder_of("watcher.store.sql.leases") == "store"
    assert folder_of("watcher.errors") is None
