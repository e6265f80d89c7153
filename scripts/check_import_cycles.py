"""Fails (exit 1) when modules of the `argosy` package import each other in a circle.

    python scripts/check_import_cycles.py                 every import (CI)
    python scripts/check_import_cycles.py --import-time   only the imports that run at import time

An import runs at import time at the top level, in a class body, or in a top-level `if`/`try`/`with`;
one inside a function is lazy. Lazy imports are fine (to defer a heavy dependency, say) unless they
close a circle: a lazy import that dodges an import-time error is still a circle between the two
modules (each needs the other), and the ones issue 23 names were all of that kind. So CI counts both,
and the report marks each step `->` (import time) or `~>` (inside a function).
`if TYPE_CHECKING:` blocks never run and are skipped. `from a.b import c` depends on the module
a.b.c when c is one, else on a.b (its __init__); a package's parents are not counted.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: Path) -> dict[str, Path]:
    return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it is lazy (inside a function)."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, lazy))
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), lazy)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
            else:
                visit(child, lazy)

    visit(tree, False)
    return out


def targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, known: set[str]) -> list[str]:
    """The package's modules one import statement depends on."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = here.split(".") if is_package else here.split(".")[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join([*parts, *([base] if base else [])])
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:  # `import argosy.x.y` where y is an attribute, or not ours
            name = name.rpartition(".")[0]
        if name and name != here:
            out.append(name)
    return out


def graph(package: Path, lazy: bool) -> dict[str, dict[str, bool]]:
    """module -> {imported module: whether only inside functions}; `lazy`: count those imports."""
    mods = modules(package)
    known = set(mods)
    g: dict[str, dict[str, bool]] = {m: {} for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, is_lazy in imports(tree):
            if is_lazy and not lazy:
                continue
            for t in targets(node, name, path.name == "__init__.py", known):
                g[name][t] = g[name].get(t, True) and is_lazy
    return g


def cycles(g: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:  # iterative: deep import chains must not hit the recursion limit
        work = [(v, iter(g[v]))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(g[w])))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in g:
        if v not in index:
            strong(v)
    return sorted(out)


def one_circle(g: dict[str, dict[str, bool]], comp: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth first, inside it)."""
    members, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in g[v]:
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--import-time", action="store_true", help="ignore imports inside functions")
    ap.add_argument("package", nargs="?", default=str(ROOT / "argosy"))
    args = ap.parse_args(argv)
    package = Path(args.package).resolve()
    g = graph(package, lazy=not args.import_time)
    found = cycles(g)
    for comp in found:
        circle = one_circle(g, comp)
        steps = " ".join(f"{a} {'~>' if g[a][b] else '->'}" for a, b in zip(circle, circle[1:], strict=False))
        print(f"import circle: {steps} {circle[-1]}")
        if len(circle) - 1 < len(comp):
            print(f"  (one circle among {len(comp)} modules: {', '.join(comp)})")
    if found:
        print(f"{len(found)} import circle(s) in {package.name}/ (-> at import time, ~> inside a function)")
        return 1
    print(f"no import circles in {package.name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
