"""The curated API, checked on the source: sorted ``__all__`` lists, and interfaces that
name only what is used.

Every ``__all__`` of the package is in plain ``sorted()`` order, without
repeats, and names what its module binds; ``config``'s lists every setting
it defines. A subpackage's ``__init__`` names its interface for the layers
above (and the device room's for the rest of the writer): each name of it is
imported somewhere outside it (the package's other layers, the tests, the
benchmarks, the examples), or it goes.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import pytest

from ..support.exports import public_definitions, read_exports, used_names
from ..support.module_graph import ROOT

REPO = ROOT.parent
#: The subpackages that name an interface in their ``__init__``.
INTERFACES = ("cache", "format", "fs", "identity", "reader", "remote", "writer", "writer.device")
#: Where the users of an interface are.
USERS = ("tensorstore_cache", "tests", "benchmarks", "examples")


def test_every_all_is_sorted_without_repeats_and_names_what_its_module_binds() -> None:
    exports = read_exports(REPO, "tensorstore_cache")
    assert len(exports) > 50  # every module with a list was read
    unsorted = {e.module for e in exports if e.names != sorted(set(e.names))}
    assert unsorted == set()
    unbound = {e.module: sorted(set(e.names) - e.bound) for e in exports
               if not set(e.names) <= e.bound and "_MODULES" not in e.bound}
    assert unbound == {}


def test_config_lists_every_setting_it_defines() -> None:
    (config,) = [e for e in read_exports(REPO, "tensorstore_cache")
                 if e.module == "tensorstore_cache.config"]
    assert public_definitions(ROOT / "config.py") - set(config.names) == set()


@functools.cache
def _uses(root: Path, users: tuple[str, ...]) -> frozenset[tuple[str, str, str]]:
    return frozenset(used_names(root, users))


def _unused(root: Path, package: str, users: tuple[str, ...]) -> set[str]:
    (exports,) = [e for e in read_exports(root, package.split(".")[0]) if e.module == package]
    used = {name for importer, source, name in _uses(root, users)
            if source == package and importer != package
            and not importer.startswith(package + ".")}
    return set(exports.names) - used


@pytest.mark.parametrize("sub", INTERFACES)
def test_an_interface_names_only_what_is_used_outside_it(sub: str) -> None:
    unused = _unused(REPO, f"tensorstore_cache.{sub}", USERS)
    assert unused == set(), (
        "interface names nothing outside the subpackage imports: delete them from its __init__.py"
    )


def test_the_check_finds_a_name_only_its_own_package_uses(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""p"""\n')
    (pkg / "low" / "__init__.py").write_text(textwrap.dedent('''\
        """l"""
        from .a import kept, lonely, read
        __all__ = ["kept", "lonely", "read"]
    '''))
    (pkg / "low" / "a.py").write_text('"""a"""\ndef kept(): pass\ndef lonely(): pass\n'
                                      'def read(): pass\n')
    (pkg / "low" / "b.py").write_text('"""b"""\nfrom . import lonely\n')  # inside: no use
    (pkg / "high.py").write_text('"""h"""\nfrom .low import kept\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("import pkg.low as low\nlow.read()\n")
    assert _unused(tmp_path, "pkg.low", ("pkg", "tests")) == {"lonely"}
    assert _unused(tmp_path, "pkg.low", ("pkg",)) == {"lonely", "read"}
