"""The package's import graph, from its ``from ... import`` statements, at module level and inside functions alike
(a deferred import that closes a loop is still a cycle): between modules, and between top-level parts
(minidnn.tensor, minidnn.nn, minidnn.backend, ...).  ``python tools/import_graph.py`` prints the parts' edges and
any cycle; tests/test_import_graph.py asserts that there is none and that the engine and the backend sit where
docs/architecture.md puts them."""
from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "minidnn"


def _modules():
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _targets(mods, name, path, node):
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    if node.level:
        base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]


def part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def module_graph() -> dict:
    """{module: set of minidnn modules it imports}, every import statement counted."""
    mods = _modules()
    graph = collections.defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                graph[name].update(t for t in _targets(mods, name, path, node) if t in mods and t != name)
    return dict(graph)


def layer_graph() -> dict:
    """{part: set of parts it imports}; the package's own __init__ (the public face) is left out."""
    graph = collections.defaultdict(set)
    for name, targets in module_graph().items():
        for t in targets:
            a, b = part(name), part(t)
            if a != b and a != "minidnn":
                graph[a].add(b)
    return dict(graph)


def cycles(graph: dict) -> list:
    color, found = {}, []

    def visit(u, stack):
        color[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if color.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif not color.get(v):
                visit(v, stack)
        stack.pop()
        color[u] = 2
    for u in sorted(graph):
        if not color.get(u):
            visit(u, [])
    return found


if __name__ == "__main__":
    g = layer_graph()
    for a in sorted(g):
        print(f"{a} -> {', '.join(sorted(x.removeprefix('minidnn.') for x in g[a]))}")
    print("cycles between parts:", cycles(g) or "none")
    print("cycles between modules:", cycles(module_graph()) or "none")
