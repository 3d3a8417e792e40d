"""The layout holds: imports point down, nothing imports in a circle, and no folder or
module outgrows its room. Read from the sources' own import statements (every one,
those inside functions and under ``TYPE_CHECKING`` included, relative ones resolved to
the modules they name), so a new edge fails here before it lands. The checks are run on
small planted trees too, so that each is seen to fail on what it forbids."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
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
    # testing (the handlers' test kit) drives the client and the HTTP processor; no other
    # folder imports it.
    "processor": ["wire", "observe", "notify", "feed", "client", "http", "testing", "console",
                  "api", "cli"],
    "handlers": ["wire"],
}
MAX_MODULES_PER_FOLDER = 15
MAX_LINES_PER_MODULE = 400


@dataclass(frozen=True)
class Tree:
    """A source tree's modules by dotted name, and the modules of it each one imports."""

    modules: dict[str, Path]
    edges: dict[str, set[str]]


def modules(root: Path) -> dict[str, Path]:
    """Every module of the three packages under ``root`` by dotted name (migrations'
    revisions aside: Alembic loads them by path)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if ".migrations.versions" not in name:
                found[name] = path
    return found


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module of ``known`` that ``name`` (a module, or a name in one) lives in."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str | None:
    """The absolute module a ``from`` import reads from: ``from ..store import sql`` in
    ``watcher.rules.ids`` is ``watcher.store``. ``None`` for a relative import that climbs
    past its top-level package (Python refuses it)."""
    if node.level == 0:
        return node.module
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if node.level - 1 >= len(base):
        return None
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(path: Path, importer: str, known: dict[str, Path]) -> Iterator[str]:
    """The modules of ``known`` that ``path`` (module ``importer``) imports, relative
    imports resolved to absolute names."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node, importer, path.name == "__init__.py")
            if module is None:
                continue
            names = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = resolve(name, known)
            if target is not None:
                yield target


def read_tree(root: Path) -> Tree:
    """The modules under ``root`` and their imports of each other."""
    found = modules(root)
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in found.items():
        edges[name].update(target for target in imports_of(path, name, found)
                           if target != name)
    return Tree(found, edges)


TREE = read_tree(ROOT)


def folder_of(module: str, tree: Tree = TREE) -> str | None:
    """The concern folder a module lives in (``watcher.store.sql.leases`` -> ``store``),
    or ``None`` for a package's shared top-level modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and
                                           (tree.modules[module].name == "__init__.py")) else None


def upward_imports(tree: Tree) -> list[str]:
    """The imports of one package by another that :data:`ALLOWED` does not allow."""
    return [f"{source} -> {target}" for source, targets in sorted(tree.edges.items())
            for target in sorted(targets)
            if target.split(".")[0] != source.split(".")[0]
            and target.split(".")[0] not in ALLOWED[source.split(".")[0]]]


def imports_from_above(tree: Tree) -> list[str]:
    """The imports of a folder from a folder above it in :data:`FOLDER_ORDER`."""
    wrong = []
    for source, targets in sorted(tree.edges.items()):
        package, folder = source.split(".")[0], folder_of(source, tree)
        order = FOLDER_ORDER[package]
        if folder not in order:
            continue
        for target in sorted(targets):
            if target.split(".")[0] != package:
                continue
            other = folder_of(target, tree)
            if other in order and order.index(other) > order.index(folder):
                wrong.append(f"{source} ({folder}) -> {target} ({other})")
    return wrong


def circles(tree: Tree) -> list[list[str]]:
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
        for target in tree.edges.get(node, ()):
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

    for node in sorted(tree.modules):
        if node not in index:
            visit(node)
    return found


def test_the_packages_import_only_downward() -> None:
    upward = upward_imports(TREE)
    assert not upward, "imports that point up (pass what is needed in instead):\n" + \
        "\n".join(upward)


def test_folders_import_only_from_folders_below_them() -> None:
    wrong = imports_from_above(TREE)
    assert not wrong, (f"folders import from above them; the order, bottom up: "
                       f"{FOLDER_ORDER}\n" + "\n".join(wrong))


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert circles(TREE) == []


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
    long = {str(path.relative_to(ROOT)): lines for path in TREE.modules.values()
            if "migrations" not in path.parts
            and (lines := len(path.read_text(encoding="utf-8").splitlines()))
            > MAX_LINES_PER_MODULE}
    assert not long, f"split these modules by role: {long}"


def test_the_checks_see_the_tree() -> None:
    """The graph is read at all: a rule over an empty graph would pass for ever."""
    assert len(TREE.modules) > 100
    assert any(target.startswith("watcher.store") for target in TREE.edges["watcher.watcher"])
    assert folder_of("watcher.store.sql.leases") == "store"
    assert folder_of("watcher.errors") is None


# The checks themselves, on a small tree planted in a temporary folder: each finds the
# violation it exists for, and a clean tree passes them all.
CLEAN_TREE = {
    "watcher/__init__.py": "",
    "watcher/errors.py": "",
    "watcher/rules/__init__.py": "",
    "watcher/rules/ids.py": "from watcher.errors import ConfigError\n",
    "watcher/rules/spans.py": "from . import ids\n",
    "watcher/store/__init__.py": "from .sql import Statements\n",
    "watcher/store/sql.py": ("from watcher.rules.ids import check\n"
                             "from ..rules import spans\n"
                             "from ..errors import ConfigError\n"),
    "watcher/store/codecs.py": "",
    "processor/__init__.py": "",
    "processor/service.py": "import watcher.store.sql\nfrom handlers import app\n",
    "handlers/__init__.py": "",
}


def plant(root: Path, changes: dict[str, str]) -> Tree:
    """The clean tree under ``root``, with ``changes`` (path -> source) written over it."""
    for relative, text in {**CLEAN_TREE, **changes}.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    return read_tree(root)


@pytest.mark.parametrize(("importer", "is_package", "statement", "expected"), [
    ("watcher.rules.ids", False, "from watcher.store import sql", "watcher.store"),
    ("watcher.rules.ids", False, "from . import spans", "watcher.rules"),
    ("watcher.rules.ids", False, "from .spans import f", "watcher.rules.spans"),
    ("watcher.rules.ids", False, "from ..store.sql import f", "watcher.store.sql"),
    ("watcher.rules", True, "from .ids import f", "watcher.rules.ids"),
    ("watcher.rules", True, "from .. import errors", "watcher"),
    ("watcher.errors", False, "from .. import processor", None),
])
def test_relative_imports_resolve_to_absolute_modules(
        importer: str, is_package: bool, statement: str, expected: str | None) -> None:
    node = ast.parse(statement).body[0]
    assert isinstance(node, ast.ImportFrom)
    assert absolute(node, importer, is_package) == expected


def test_a_clean_planted_tree_passes_every_check(tmp_path: Path) -> None:
    tree = plant(tmp_path, {})
    assert tree.edges["watcher.store.sql"] == {"watcher.rules.ids", "watcher.rules.spans",
                                              "watcher.errors"}
    assert tree.edges["watcher.store"] == {"watcher.store.sql"}
    assert upward_imports(tree) == []
    assert imports_from_above(tree) == []
    assert circles(tree) == []


def test_an_upward_import_between_packages_is_reported(tmp_path: Path) -> None:
    tree = plant(tmp_path, {"watcher/rules/ids.py": "import processor.service\n"})
    assert upward_imports(tree) == ["watcher.rules.ids -> processor.service"]


@pytest.mark.parametrize(("path", "source"), [
    ("watcher/rules/spans.py", "from watcher.store.codecs import encode\n"),
    ("watcher/rules/spans.py", "def f():\n    from ..store import codecs\n"),
    ("watcher/rules/spans.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..store.codecs import C\n"),
])
def test_a_folder_importing_from_a_folder_above_it_is_reported(
        tmp_path: Path, path: str, source: str) -> None:
    tree = plant(tmp_path, {path: source})
    assert imports_from_above(tree) == [
        "watcher.rules.spans (rules) -> watcher.store.codecs (store)"]
    assert circles(tree) == []


def test_a_relative_import_from_above_in_a_folders_init_is_reported(tmp_path: Path) -> None:
    tree = plant(tmp_path, {"watcher/rules/__init__.py": "from ..store.codecs import C\n"})
    assert imports_from_above(tree) == ["watcher.rules (rules) -> watcher.store.codecs (store)"]


@pytest.mark.parametrize("import_back", ["from watcher.store import sql\n",
                                         "from ..store import sql\n"])
def test_a_circle_is_reported(tmp_path: Path, import_back: str) -> None:
    """``watcher.store.sql`` imports ``watcher.rules.ids`` (and ``spans``, which imports
    ``ids``); an import back closes a circle, written absolute or relative."""
    tree = plant(tmp_path, {"watcher/rules/ids.py": import_back})
    assert circles(tree) == [["watcher.rules.ids", "watcher.rules.spans", "watcher.store.sql"]]
    assert imports_from_above(tree) == ["watcher.rules.ids (rules) -> watcher.store.sql (store)"]


def test_a_circle_within_a_folder_is_reported(tmp_path: Path) -> None:
    tree = plant(tmp_path, {"watcher/rules/ids.py": "from .spans import f\n"})
    assert circles(tree) == [["watcher.rules.ids", "watcher.rules.spans"]]
    assert imports_from_above(tree) == []
