"""Counts of the import structure against the layer contract in pyproject.toml: modules, imports,
layers, imports that run against the layers (a lower layer importing a higher one, or siblings
marked independent with `|` importing each other), and import cycles between modules.

    .venv/bin/python scripts/layers.py        (lint-imports checks the same contract and fails on it)
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def layer_of(module: str, layers: list[list[str]]) -> tuple[int, str] | None:
    """(layer index, the sibling that holds the module) for the longest matching prefix."""
    best = None
    for i, siblings in enumerate(layers):
        for name in siblings:
            if (module == name or module.startswith(name + ".")) and (
                best is None or len(name) > len(best[1])
            ):
                best = (i, name)
    return best


def cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.find_modules_directly_imported_by(v) & modules:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for m in sorted(modules):
        if m not in index:
            visit(m)
    return out


def main() -> int:
    sys.path.insert(0, str(ROOT))
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    spec = conf["contracts"][0]["layers"]
    layers = [[n.strip() for n in row.replace(":", "|").split("|")] for row in spec]
    independent = [("|" in row) for row in spec]
    graph = grimp.build_graph(conf["root_package"])
    modules = set(graph.modules)
    against = []
    imports = 0
    for m in sorted(modules):
        for t in graph.find_modules_directly_imported_by(m) & modules:
            imports += 1
            a, b = layer_of(m, layers), layer_of(t, layers)
            if a is None or b is None:
                continue
            if b[0] < a[0] or (a[0] == b[0] and a[1] != b[1] and independent[a[0]]):
                against.append(f"{m} -> {t}")
    found = cycles(graph, modules)
    print(f"modules {len(modules)}, imports {imports}, layers {len(layers)}")
    print(f"imports against the layers: {len(against)}")
    for line in against:
        print(f"  {line}")
    print(f"import cycles: {len(found)}")
    for c in found:
        print(f"  {' <-> '.join(c)}")
    return 1 if against or found else 0


if __name__ == "__main__":
    sys.exit(main())
