"""The import graph: every package of polar sits in a layer of the import-linter contract (pyproject.toml), and no
module imports itself back, TYPE_CHECKING imports included (grimp, import-linter's own graph builder)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def _cycles(graph) -> list[list[str]]:
    """The import cycles among polar's modules: strongly connected components of more than one module, or one that
    imports itself (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.find_modules_directly_imported_by(node):
                        found.append(sorted(component))
    return found


def test_no_import_cycle_type_checking_imports_included():
    graph = grimp.build_graph("polar", include_external_packages=False, exclude_type_checking_imports=False)
    assert _cycles(graph) == []


def test_the_layer_contract_covers_every_package_of_polar():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["type"] == "layers")["layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    polar = ROOT / "polar"
    packages = {f"polar.{p.parent.name}" for p in polar.glob("*/__init__.py")}
    modules = {f"polar.{p.stem}" for p in polar.glob("*.py") if p.name != "__init__.py"}
    assert packages | modules == named, "put each package of polar in one layer of pyproject's contract"
