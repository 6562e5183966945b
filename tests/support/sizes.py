"""Sizes of the package's modules and functions, in lines of code.

A line of code is a line holding something other than a comment, blank space
or a docstring (a module's, class's or function's). A nested function or class
counts in its parent function; a method is a function of its own.
``python -m tests.support.sizes`` prints the largest modules and every function
over the limit.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "tensorstore_cache"

#: The standing limits (DEVELOPERS.md).
MODULE_LIMIT = 450
FUNCTION_LIMIT = 60


@dataclass(frozen=True)
class Size:
    """One module or function and its lines of code."""

    where: str
    lines: int


def code_lines(source: str) -> set[int]:
    """The numbers of the lines of ``source`` that hold code (docstrings and comments out)."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                        tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.difference_update(range(body[0].lineno, (body[0].end_lineno or 0) + 1))
    return lines


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function not nested in another function (methods included)."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(child)  # its nested functions count in it: not visited
            else:
                visit(child)

    visit(tree)
    return found


def measure(root: Path = ROOT) -> tuple[list[Size], list[Size]]:
    """``(modules, functions)`` of the package under ``root``, each with its lines of code."""
    modules: list[Size] = []
    functions: list[Size] = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        code = code_lines(source)
        rel = path.relative_to(root.parent).as_posix()
        modules.append(Size(rel, len(code)))
        for fn in _functions(ast.parse(source)):
            start = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
            span = range(start, (fn.end_lineno or fn.lineno) + 1)
            functions.append(Size(f"{rel}:{fn.name}", len(code.intersection(span))))
    return modules, functions


def main(argv: list[str] | None = None) -> None:
    """Print the largest modules and every function over the limit."""
    argparse.ArgumentParser(prog="python -m tests.support.sizes",
                            description=__doc__.split("\n\n")[0]).parse_args(argv)
    modules, functions = measure()
    for size in sorted(modules, key=lambda s: -s.lines)[:10]:
        print(f"{size.lines:5d}  {size.where}")
    print()
    for size in sorted(functions, key=lambda s: -s.lines):
        if size.lines > FUNCTION_LIMIT:
            print(f"{size.lines:5d}  {size.where}")
    sys.exit(0)


if __name__ == "__main__":
    main()
