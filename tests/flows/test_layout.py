"""The house's rules for flows/ (ARCHITECTURE.md section 7), read from the imports (lazy imports
inside functions included): no import cycle among flows/ modules; the command line package
flows/cli/ is assembled by its __init__.py, which nothing inside the package imports; its area
modules import common.py, never each other; no file of flows/ over 800 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.flows.conftest import REPO

MAX_LINES = 800


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted((REPO / "flows").rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the flows modules it imports (``from flows.cli import common`` is flows.cli.common)."""

    def resolve(target: str) -> str | None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    edges = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(resolve(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                out.update(resolve(f"{base}.{a.name}") for a in node.names)
        out.discard(None)
        out.discard(name)
        edges[name] = out
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_flows():
    assert _cycles(_imports(_modules())) == []


def test_cli_areas_import_common_only_and_nobody_imports_the_assembly():
    edges = _imports(_modules())
    cli = {m for m in edges if m == "flows.cli" or m.startswith("flows.cli.")}
    wrong = []
    for name, targets in edges.items():
        for t in targets & cli:
            if name == "flows.cli" or (name == "flows.cli.__main__" and t == "flows.cli"):
                continue  # the assembly imports every area; `python -m flows.cli` runs it
            if name in cli and t != "flows.cli.common":
                wrong.append(f"{name} -> {t}")  # an area imports common only, never the assembly
            if name not in cli and t not in ("flows.cli", "flows.cli.common"):
                wrong.append(f"{name} -> {t}")  # the runtime uses the app (flows.cli) or common, no area
    assert not edges["flows.cli.common"] & cli
    assert wrong == []


def test_no_file_of_flows_over_800_lines():
    long = {str(p.relative_to(REPO)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
