"""The package's module graph: modules, lines, internal imports and import cycles.

Run ``python -m tests.support.module_graph [--json] [--package DIR]``. Every ``import``
statement is read from the source (``ast``), wherever it stands: at module
level, inside a function (a lazy import) or under ``if TYPE_CHECKING:``.
Nothing is imported, so a broken or circular package can be examined too.

Output: one line per module with its line count and the internal modules it
imports (``name*`` lazily, inside a function; ``name?`` only for type
checking), then every import cycle: the strongly connected components of the
graph, counting every import (a lazy import closes a circle as soon as it
runs).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["Edge", "Graph", "cycles", "imported_from", "mutual", "read_graph"]

ROOT = Path(__file__).resolve().parents[2] / "tensorstore_cache"

Kind = Literal["top", "lazy", "typing"]


@dataclass(frozen=True, slots=True)
class Edge:
    """One internal import: ``source`` imports ``target``."""

    source: str
    target: str
    kind: Kind
    """``"top"`` at module level, ``"lazy"`` inside a function, ``"typing"`` under TYPE_CHECKING."""
    line: int


@dataclass(slots=True)
class Graph:
    """Modules (dotted name -> source lines) and the imports between them."""

    package: str
    lines: dict[str, int] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    def targets(self, module: str) -> dict[str, Kind]:
        """Internal modules imported by ``module``, each with its strongest kind."""
        rank = {"top": 0, "lazy": 1, "typing": 2}
        out: dict[str, Kind] = {}
        for e in self.edges:
            if e.source == module and (e.target not in out or rank[e.kind] < rank[out[e.target]]):
                out[e.target] = e.kind
        return out


def _module_name(package: str, root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of the module a ``from ... import`` statement of ``module`` (a
    package's ``__init__`` if ``is_package``) imports from."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module = module
        self.is_package = is_package
        self.known = known
        self.found: list[tuple[str, Kind, int]] = []
        self._depth = 0
        self._typing = 0

    def _kind(self) -> Kind:
        return "typing" if self._typing else ("lazy" if self._depth else "top")

    def _add(self, name: str, line: int) -> None:
        # the module itself if known, else its nearest known parent (a name inside a module)
        while name and name not in self.known:
            name = name.rpartition(".")[0]
        if name and name != self.module:
            self.found.append((name, self._kind(), line))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = _function  # noqa: N815
    visit_AsyncFunctionDef = _function  # noqa: N815
    visit_Lambda = _function  # noqa: N815

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._typing += 1
            for child in node.body:
                self.visit(child)
            self._typing -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        prefix = imported_from(node, self.module, self.is_package)
        for alias in node.names:
            full = f"{prefix}.{alias.name}"
            self._add(full if full in self.known else prefix, node.lineno)


def read_graph(root: Path = ROOT) -> Graph:
    """Read every module under ``root`` (a package directory) and its internal imports."""
    package = root.name
    files = sorted(root.rglob("*.py"))
    names = {_module_name(package, root, f): f for f in files}
    graph = Graph(package)
    for name, path in names.items():
        text = path.read_text(encoding="utf-8")
        graph.lines[name] = len(text.splitlines())
        collector = _Collector(name, path.name == "__init__.py", set(names))
        collector.visit(ast.parse(text, str(path)))
        graph.edges.extend(Edge(name, t, k, line) for t, k, line in collector.found)
    return graph


def cycles(graph: Graph, *, kinds: tuple[Kind, ...] = ("top", "lazy", "typing")) -> list[list[str]]:
    """Return the import cycles: strongly connected components of two or more modules.

    Parameters
    ----------
    graph
        The module graph.
    kinds
        Which imports count (default: all of them, lazy and type-checking ones included).
    """
    succ: dict[str, set[str]] = {m: set() for m in graph.lines}
    for e in graph.edges:
        if e.kind in kinds:
            succ[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:  # Tarjan's algorithm
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(succ):
        if v not in index:
            visit(v)
    return sorted(out)


def mutual(graph: Graph) -> list[tuple[str, str]]:
    """Return the pairs of modules that import each other (the shortest circles)."""
    pairs = {(e.source, e.target) for e in graph.edges}
    return sorted((a, b) for a, b in pairs if a < b and (b, a) in pairs)


def report(graph: Graph) -> str:
    """The graph as text: one line per module, then the cycles."""
    short = len(graph.package) + 1
    mark = {"top": "", "lazy": "*", "typing": "?"}
    rows = []
    for name in sorted(graph.lines):
        deps = graph.targets(name)
        shown = ", ".join(f"{t[short:] or t}{mark[k]}" for t, k in sorted(deps.items()))
        rows.append(f"{name[short:] or '__init__':<22} {graph.lines[name]:>5}  {shown}")
    found = cycles(graph)
    run_time = cycles(graph, kinds=("top", "lazy"))
    lines = [
        f"{len(graph.lines)} modules, {sum(graph.lines.values())} lines, "
        f"{len({(e.source, e.target) for e in graph.edges})} internal imports "
        "(name* imported inside a function, name? for type checking only)",
        "",
        *rows,
        "",
        f"import cycles (every import counted): {len(found)}; "
        f"at run time (type-checking imports left out): {len(run_time)}",
        *(f"  {' <-> '.join(c[short:] for c in comp)}" for comp in found),
        f"modules importing each other: {len(mutual(graph))}",
        *(f"  {a[short:]} <-> {b[short:]}" for a, b in mutual(graph)),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, default=ROOT, help="the package directory")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    graph = read_graph(args.package.resolve())
    if args.json:
        print(json.dumps({
            "modules": graph.lines,
            "imports": [[e.source, e.target, e.kind, e.line] for e in graph.edges],
            "cycles": cycles(graph),
        }, indent=1))
    else:
        print(report(graph))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
