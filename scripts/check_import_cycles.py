"""Fails on an import cycle among a package's modules, reading only their source (ast).

    python scripts/check_import_cycles.py [--root PACKAGE_DIR] [--lazy] [MODULE_PREFIX ...]
        e.g. argosy.engine (default: every cycle in the package; the package: argosy beside this script)

Counted: imports that run when a module is imported (module level, including under `if` / `try`, but
not under `if TYPE_CHECKING:`). Imports inside functions run later and are how a module reaches
upward on purpose, so they are not counted. `from pkg import name` counts as importing pkg.name when
that is a module, else pkg. With --lazy the imports inside functions count too (a cycle there does
not fail an import, but still ties two layers together). Prints each cycle found (as a chain of
modules) and exits 1, else exits 0.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, lazy: bool = False):
    """Import nodes that run when the module is imported: at module level and inside if / try / with,
    not in a def or class body; lazy: those too. Never those under `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
        elif lazy or not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            stack.extend(n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt))


def import_graph(root: Path, lazy: bool = False) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in _imports(tree, lazy):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(node, name, is_package)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as a chain."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_chain(graph, set(c)) for c in components]


def _chain(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, through the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return sorted(component)


def cycles_within(root: Path, prefixes: list[str], lazy: bool = False) -> list[list[str]]:
    """The cycles among root's modules (a package folder) that touch a module under one of prefixes."""
    def under(name: str) -> bool:
        return not prefixes or any(name == p or name.startswith(p + ".") for p in prefixes)

    return [c for c in find_cycles(import_graph(root, lazy)) if any(under(m) for m in c)]


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent / "argosy"
    if argv[:1] == ["--root"]:
        root, argv = Path(argv[1]).resolve(), argv[2:]
    lazy = "--lazy" in argv
    argv = [a for a in argv if a != "--lazy"]
    cycles = cycles_within(root, argv, lazy)
    for cycle in cycles:
        print("import cycle: " + " -> ".join(cycle))
    if cycles:
        print(f"{len(cycles)} import cycle(s); move the shared code into a module both can import, "
              "or import inside the function that needs it")
        return 1
    print(f"no import cycles in {', '.join(argv) or 'argosy'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
