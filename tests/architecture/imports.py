"""The import graph of ``tesla_gateway``, read from the source (no import executed)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "tesla_gateway"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. tesla_gateway.ingest.admission
    path: Path
    is_package: bool


def modules(root: Path = PACKAGE_DIR) -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = Module(".".join(parts), path, is_package)
    return found


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imported_names(module: Module) -> Iterator[str]:
    """Every dotted name the module imports, at any depth (lazy imports count: they are edges)."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            yield target
            for alias in node.names:
                yield f"{target}.{alias.name}"


def graph(root: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """module -> the package modules it imports (``from a import b`` counts b if a module)."""
    known = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, module in known.items():
        for imported in imported_names(module):
            if imported in known and imported != name:
                edges[name].add(imported)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found
