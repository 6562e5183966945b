"""The package's layers: imports only downwards, no import circle, checked for real.

The layer order lives in ``pyproject.toml`` (an import-linter ``layers``
contract, run by ``make lint``); these tests check that the contract is kept
on the real tree, that it breaks on an upward import (a lazy one, inside a
function), and that the tree has no import circle at all, counting lazy and
type-checking imports (:mod:`tests.support.module_graph`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..support.module_graph import ROOT, cycles, mutual, read_graph

REPO = ROOT.parent
LINT = Path(sys.executable).with_name("lint-imports")
needs_linter = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def test_no_import_cycle_counting_lazy_and_type_checking_imports() -> None:
    graph = read_graph()
    assert cycles(graph) == []
    assert mutual(graph) == []


def test_no_module_imports_the_package_itself() -> None:
    # the package's __init__ imports every layer: importing it from inside would close a circle
    graph = read_graph()
    inward = [e for e in graph.edges if e.target == "tensorstore_cache"]
    assert inward == []


SUBPACKAGES = ("identity", "fs", "format", "reader", "remote", "writer", "cache")


@pytest.mark.parametrize("sub", SUBPACKAGES)
def test_the_layers_above_a_subpackage_import_only_its_interface(sub: str) -> None:
    # ``from ..reader import CacheStore``: the names of its __init__.py, never one of its modules
    graph = read_graph()
    package = f"tensorstore_cache.{sub}"
    inside = [
        (e.source, e.target, e.line) for e in graph.edges
        if e.target.startswith(package + ".")
        and e.source != package and not e.source.startswith(package + ".")
    ]
    assert inside == []
    assert any(e.target == package for e in graph.edges)


@pytest.mark.parametrize("sub", SUBPACKAGES)
def test_an_interface_names_every_export_once(sub: str) -> None:
    import importlib

    module = importlib.import_module(f"tensorstore_cache.{sub}")
    names = module.__all__
    assert names == sorted(names) and len(set(names)) == len(names)
    where = {name: mod for mod, found in module._MODULES.items() for name in found}
    assert sorted(where) == names
    for name in names:  # each name is its module's (never a submodule of the same name)
        defined = importlib.import_module(f"tensorstore_cache.{sub}.{where[name]}")
        assert getattr(module, name) is getattr(defined, name), name
        assert not (ROOT / sub / f"{name}.py").exists(), f"{sub}.{name} is also a module"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        module.nope  # noqa: B018


def test_every_module_has_a_docstring() -> None:
    import ast

    missing = [
        str(p.relative_to(REPO))
        for p in sorted(ROOT.rglob("*.py"))
        if ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) is None
    ]
    assert missing == []


def test_the_graph_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""p"""\n')
    (pkg / "low" / "__init__.py").write_text('"""l"""\n')
    (pkg / "low" / "a.py").write_text(textwrap.dedent('''\
        """a"""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from ..high import b
        def f():
            from ..high.b import g
            return g
    '''))
    (pkg / "high").mkdir()
    (pkg / "high" / "__init__.py").write_text('"""h"""\n')
    (pkg / "high" / "b.py").write_text('"""b"""\nfrom ..low import a\ndef g(): pass\n')
    graph = read_graph(pkg)
    assert graph.targets("pkg.low.a") == {"pkg.high.b": "lazy"}
    assert graph.targets("pkg.high.b") == {"pkg.low.a": "top"}
    assert cycles(graph) == [["pkg.high.b", "pkg.low.a"]]
    assert cycles(graph, kinds=("top",)) == []


@needs_linter
def test_the_layers_contract_is_kept() -> None:
    run = subprocess.run(
        [str(LINT), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout


@needs_linter
@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("format/keys.py", "from ..cache import gc"),  # format -> cache
        ("reader/store.py", "from .. import _api"),  # reader -> the routing above it
        ("fs/opens.py", "from ..format import metadata"),  # fs -> format
    ],
)
def test_an_upward_import_breaks_the_contract(tmp_path: Path, module: str, upward: str) -> None:
    copy = tmp_path / "tensorstore_cache"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(copy / module, "a", encoding="utf-8") as f:  # lazily, inside a function
        f.write(f"\n\ndef _upward() -> None:\n    {upward}  # noqa: F401\n")
    run = subprocess.run(
        [str(LINT), "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode != 0, run.stdout
    assert "0 kept, 1 broken" in run.stdout
    importer = "tensorstore_cache." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> " in run.stdout
