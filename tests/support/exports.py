"""What modules export (``__all__``) and who imports it, read from the source.

Every file is parsed (``ast``), nothing is imported, so a module that needs
an optional dependency (torch) is read like any other. A name counts as used
where a file imports it from its module (``from pkg.sub import name``, also
relatively) or reads it as an attribute of its module bound to a name
(``import pkg.sub as sub`` then ``sub.name``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .module_graph import imported_from

__all__ = ["Exports", "module_name", "public_definitions", "read_exports", "used_names"]


def module_name(root: Path, path: Path) -> str:
    """The dotted name of the module at ``path`` under ``root`` (the directory holding the
    top-level packages)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True)
class Exports:
    """One module's ``__all__`` as written, and the names its top level binds."""

    module: str
    names: list[str]
    bound: set[str] = field(default_factory=set)


def _top_level(body: Iterable[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements of a module's top level, those under ``if`` and ``try`` included."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)


def _bound(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        names.add(t.id)
    return names


def public_definitions(path: Path) -> set[str]:
    """The public names a module defines itself at its top level (no import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if not n.startswith("_")}


def read_exports(root: Path, package: str) -> list[Exports]:
    """The ``__all__`` of every module of ``package`` (a directory under ``root``) that has
    one."""
    out = []
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "__all__"
                    and isinstance(node.value, (ast.List, ast.Tuple))):
                names = [e.value for e in node.value.elts
                         if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                out.append(Exports(module_name(root, path), names, _bound(tree)))
    return out


def _imported_from(tree: ast.Module, module: str, is_package: bool) -> Iterable[tuple[str, str]]:
    """``(module, name)`` of every name a file imports from a module or reads from one."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = imported_from(node, module, is_package)
            for a in node.names:
                yield source, a.name
                aliases[a.asname or a.name] = f"{source}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = []
            value: ast.expr = node
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                dotted = [aliases[value.id], *reversed(chain)]
                for cut in range(1, len(dotted)):
                    yield ".".join(dotted[:cut]), dotted[cut]


def used_names(root: Path, folders: Iterable[str]) -> set[tuple[str, str, str]]:
    """``(importing module, module, name)`` of every name imported (or read from a module)
    by the files under ``root / folder`` for each of ``folders``."""
    used: set[tuple[str, str, str]] = set()
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            importer = module_name(root, path)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for source, name in _imported_from(tree, importer, path.name == "__init__.py"):
                used.add((importer, source, name))
    return used
