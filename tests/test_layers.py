"""The layering of docs/architecture.md, checked from the source: every import
statement counts (lazy ones inside functions and ``TYPE_CHECKING`` ones too).

* no import cycle among modules (of ``wal``, ``snapshot``, ``kvstore`` and
  ``benchmarks``);
* parts (``wal``, ``snapshot``, each room of ``kvstore``) import only parts on
  a lower floor, so the part-level graph has no two-way arrow.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("wal", "snapshot", "kvstore", "benchmarks")

FLOORS = [
    {"wal"},
    {"snapshot"},
    {"kvstore.layout", "kvstore.entry"},
    {"kvstore.state"},
    {"kvstore.archive", "kvstore.watch"},
    {"kvstore.store"},
    {"kvstore.client"},
    {"kvstore.replica"},
    {"kvstore.cluster"},
    {"kvstore.server"},
    {"kvstore"},  # the public face (kvstore/__init__.py)
    {"kvstore.spark"},
    {"benchmarks"},  # `walkv bench` runs them from a source checkout
    {"kvstore.cli"},
]
FLOOR = {part: i for i, parts in enumerate(FLOORS) for part in parts}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (``from a import b`` counts as
    ``a.b`` when that is a module, else ``a``)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def part_of(module: str) -> str:
    if module.startswith("kvstore."):
        room = ".".join(module.split(".")[:2])
        return room if room in FLOOR else "kvstore.layout" if module == "kvstore.layout" else module
    return module.split(".")[0] if not module.startswith("kvstore") else "kvstore"


def test_every_kvstore_module_lives_in_a_room():
    flat = sorted(m for m in modules() if m.startswith("kvstore.") and part_of(m) not in FLOOR)
    assert flat == [], f"modules outside the rooms of docs/architecture.md: {flat}"


def test_no_import_cycle_among_modules():
    g = graph()
    seen: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if seen.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in seen:
                visit(n)
        stack.pop()
        seen[m] = 2

    for m in sorted(g):
        if m not in seen:
            visit(m)


def test_parts_import_only_lower_floors():
    upward = sorted(
        f"{m} ({part_of(m)}) imports {n} ({part_of(n)})"
        for m, deps in graph().items()
        for n in deps
        if part_of(n) != part_of(m) and FLOOR[part_of(n)] >= FLOOR[part_of(m)]
    )
    assert upward == [], "imports that do not point down:\n" + "\n".join(upward)
