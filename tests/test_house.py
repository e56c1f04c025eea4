"""The house rules of ARCHITECTURE.md section 7, read from the source itself (issue 19).

- no import cycle among the files of flows/, tasks/ and schemas/, lazy imports inside functions
  included (an import inside a function still ties the two files together for a reader);
- arrows run down: flows -> tasks -> schemas; nothing in tasks/ imports flows/, nothing in
  schemas/ imports tasks/ or flows/; the panel shell (tasks/panel) imports no protocol;
- inside flows/cli/, the sub-apps import common, never each other, and nobody but ``__main__``
  (``python -m flows.cli``) imports the package's __init__ (it only assembles the app); the flows'
  runtime below the command line imports none of it, but for the two entry points that run the app
  (``flows.launch``, ``flows.warm_server``);
- no source file over 800 lines.

The graph comes from Python's own parser (``ast``), not from importing anything, so a new cycle
fails here before it can fail at import time on someone's machine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("flows", "tasks", "schemas")
MAX_LINES = 800
PROTOCOLS = ("tasks.beauty", "tasks.vab", "schemas.study", "schemas.vab")  # each protocol's code and contracts
CLI_ENTRY_POINTS = ("flows.launch", "flows.warm_server")  # they run the app; nothing else below it may


def _modules(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its file (top level or in functions).
    ``from a.b import c`` counts as an import of ``a.b.c`` when that is a module, else of ``a.b``;
    ``importlib.import_module("a.b")`` with a literal name counts too."""
    modules = _modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(t for a in node.names if (t := resolve(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from .x import y
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    t = f"{base}.{a.name}" if f"{base}.{a.name}" in modules else resolve(base)
                    if t:
                        targets.add(t)
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                if t := resolve(node.args[0].value):
                    targets.add(t)
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the arrows: tasks -> flows, schemas -> tasks/flows, panel shell -> protocol,
    a flows/cli module -> another sub-app or the package's __init__, the flows' runtime -> flows/cli."""
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            layer, to_layer = module.split(".")[0], target.split(".")[0]
            if LAYERS.index(to_layer) < LAYERS.index(layer):
                bad.append(f"{module} -> {target} ({layer}/ must not import {to_layer}/)")
            elif module.startswith("tasks.panel") and target.startswith(PROTOCOLS):
                bad.append(f"{module} -> {target} (the panel shell imports no protocol)")
            elif module.startswith("flows.cli.") and module != "flows.cli.__main__" and target == "flows.cli":
                bad.append(f"{module} -> {target} (nobody inside flows/cli imports its __init__)")
            elif (module.startswith("flows.cli.") and target.startswith("flows.cli.")
                  and not target.startswith("flows.cli.common")):
                bad.append(f"{module} -> {target} (a sub-app imports common, never another sub-app)")
            elif (module.startswith("flows.") and not module.startswith("flows.cli") and module not in CLI_ENTRY_POINTS
                  and (target == "flows.cli" or target.startswith("flows.cli."))):
                bad.append(f"{module} -> {target} (the flows' runtime does not reach up into the command line)")
    return bad


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (lazy imports included):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_arrows_run_down():
    bad = upward_imports(import_graph())
    assert not bad, "imports against the layout of ARCHITECTURE.md section 7:\n" + "\n".join(bad)


def test_no_source_file_over_800_lines():
    files = [p for layer in (*LAYERS, "bench", "tests") for p in (REPO / layer).rglob("*.py")]
    long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them along what they hold): {long}"


# ---- the checker itself, on trees written here: it must see what it is meant to catch ------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for layer in LAYERS:
        (tmp_path / layer).mkdir(exist_ok=True)
        (tmp_path / layer / "__init__.py").touch()
    return tmp_path


@pytest.mark.parametrize(
    "files, expected",
    [
        # a lazy import inside a function still closes a cycle
        ({"tasks/a.py": "import tasks.b\n", "tasks/b.py": "def f():\n    from tasks.a import x\n"}, [["tasks.a", "tasks.b"]]),
        # `from package import module` is an edge to the module, relative imports resolve
        ({"tasks/p/__init__.py": "", "tasks/p/a.py": "from tasks.p import b\n", "tasks/p/b.py": "from . import a\n"},
         [["tasks.p.a", "tasks.p.b"]]),
        ({"tasks/a.py": "import tasks.b\n", "tasks/b.py": "import schemas\n"}, []),
        # a module imported by its literal name through importlib is an edge too
        ({"tasks/a.py": "import importlib\nB = importlib.import_module('tasks.b')\n", "tasks/b.py": "import tasks.a\n"},
         [["tasks.a", "tasks.b"]]),
    ],
)
def test_the_cycle_check_sees_lazy_and_relative_imports(tmp_path, files, expected):
    assert cycles(import_graph(_tree(tmp_path, files))) == expected


def test_the_arrow_check_names_each_wrong_import(tmp_path):
    root = _tree(tmp_path, {
        "tasks/x.py": "def f():\n    import flows.y\n",
        "flows/y.py": "",
        "schemas/s.py": "from tasks import x\n",
        "tasks/panel/__init__.py": "",
        "tasks/panel/app.py": "from tasks.beauty.study import S\n",
        "tasks/panel/db.py": "from schemas.study import Record\n",
        "schemas/study.py": "",
        "tasks/beauty/__init__.py": "",
        "tasks/beauty/study.py": "from tasks.panel import app\n",
        "flows/cli/__init__.py": "from flows.cli import vab\n",
        "flows/cli/common.py": "def f():\n    from flows.cli import vab\n",
        "flows/cli/vab.py": "from flows.cli import common\nfrom flows.cli.scoring import x\n",
        "flows/cli/scoring.py": "import flows.cli\n",
        "flows/demo.py": "def f():\n    from flows.cli.common import progress\n",
        "flows/launch.py": "def main():\n    from flows.cli import main\n",
    })
    bad = upward_imports(import_graph(root))
    assert bad == [
        "flows.cli.common -> flows.cli.vab (a sub-app imports common, never another sub-app)",
        "flows.cli.scoring -> flows.cli (nobody inside flows/cli imports its __init__)",
        "flows.cli.vab -> flows.cli.scoring (a sub-app imports common, never another sub-app)",
        "flows.demo -> flows.cli.common (the flows' runtime does not reach up into the command line)",
        "schemas.s -> tasks.x (schemas/ must not import tasks/)",
        "tasks.panel.app -> tasks.beauty.study (the panel shell imports no protocol)",
        "tasks.panel.db -> schemas.study (the panel shell imports no protocol)",
        "tasks.x -> flows.y (tasks/ must not import flows/)",
    ]
