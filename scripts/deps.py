"""Print the project's import graph and check the layer rule (dependencies point one way:
``docs/architecture.md``).

    .venv/bin/python scripts/deps.py            # package graph, violations, cycles, in-function imports
    .venv/bin/python scripts/deps.py --modules  # also every module-level edge

Walks every ``import`` statement of every module of the five packages (``common`` <- ``topologies`` <-
``traffic`` <- ``analysis`` <- ``testbed``), including imports inside functions and under
``if TYPE_CHECKING:``, and reports:

* the package graph: ``A -> B (n)`` for n imports of package B by modules of package A;
* imports against the layer rule (a module imports only its own package and packages to its left);
* cycles between modules (strongly connected components of the module graph);
* imports of project modules inside functions without a ``lazy`` comment on that line or
  the line above (the only accepted reason: keeping a heavy optional dependency lazy).

Exit status 1 if there is any violation, cycle or unexplained in-function import.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("common", "topologies", "traffic", "analysis", "testbed")
RANK = {p: i for i, p in enumerate(LAYERS)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(f): f for pkg in LAYERS for f in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module ``name`` refers to (itself, or its longest known prefix)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(mod: str, path: Path, known: dict[str, Path]):
    """(target module, line, inside a function, has a 'lazy' comment) for every project import."""
    src = path.read_text()
    lines = src.splitlines()
    tree = ast.parse(src)
    in_fn = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_fn.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = mod if is_pkg else mod.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            r = _resolve(t, known)
            if r is None or r == mod:
                continue
            ln = node.lineno
            near = " ".join(lines[max(0, ln - 2) : ln]).lower()
            yield r, ln, id(node) in in_fn, "lazy" in near


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def analyse():
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    pkg_edges: Counter = Counter()
    bad, unexplained = [], []
    for mod, path in known.items():
        for target, line, in_function, lazy in sorted(set(imports(mod, path, known))):
            graph[mod].add(target)
            a, b = mod.split(".")[0], target.split(".")[0]
            if a != b:
                pkg_edges[(a, b)] += 1
            where = f"{path.relative_to(ROOT)}:{line}"
            if RANK[b] > RANK[a]:
                bad.append(f"{where} imports {target} ({a} may not import {b})")
            if in_function and not lazy:
                unexplained.append(f"{where} imports {target} inside a function")
    return known, graph, pkg_edges, bad, sccs(graph), unexplained


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", action="store_true", help="also print every module-level edge")
    a = ap.parse_args(argv)
    known, graph, pkg_edges, bad, cycles, unexplained = analyse()
    print(f"{len(known)} modules in {', '.join(LAYERS)} (layer order, left to right)\n")
    print("package graph (importer -> imported: number of import statements):")
    for (x, y), n in sorted(pkg_edges.items(), key=lambda e: (RANK[e[0][0]], RANK[e[0][1]])):
        print(f"  {x} -> {y}: {n}{'   AGAINST THE LAYER RULE' if RANK[y] > RANK[x] else ''}")
    if a.modules:
        print("\nmodule graph:")
        for m in sorted(graph):
            if graph[m]:
                print(f"  {m} -> {', '.join(sorted(graph[m]))}")
    print(f"\nimports against the layer rule: {len(bad)}")
    for b in bad:
        print(f"  {b}")
    print(f"cycles between modules: {len(cycles)}")
    for c in cycles:
        print(f"  {' <-> '.join(c)}")
    print(f"project imports inside functions without a 'lazy' comment: {len(unexplained)}")
    for u in unexplained:
        print(f"  {u}")
    return 1 if bad or cycles or unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
