"""The import graph of ``txbroker/`` has no cycles.

Every ``import`` statement counts, wherever it stands: at the top, inside a function, or under
``if TYPE_CHECKING:`` (a cycle hidden there is still two modules that cannot be understood, or
moved, one without the other).  ``from package import name`` is an edge to ``package.name``
when that is a module, else to ``package``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "txbroker"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Module -> the txbroker modules it imports."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t in files and t != name)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_the_checker_finds_a_cycle_under_type_checking(tmp_path) -> None:
    pkg = tmp_path / "txbroker"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from txbroker.b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from . import a\n")
    (pkg / "c.py").write_text("import txbroker.a\n")
    assert find_cycles(import_graph(pkg)) == [["txbroker.a", "txbroker.b"]]


def test_txbroker_has_no_import_cycles() -> None:
    graph = import_graph()
    assert graph.get("txbroker.broker")
    assert find_cycles(graph) == []
