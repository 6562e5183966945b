"""The wheel ships every module: build it, install it apart, import everything from there.

An editable install (``pip install -e``) imports from the source tree and so
hides a wheel that forgets a subpackage; this test installs the built wheel
into its own directory and imports every module of the source tree from it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from ..support.module_graph import ROOT, read_graph

REPO = ROOT.parent


def test_the_wheel_holds_and_imports_every_module(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a clean copy: setuptools would reuse an old build/ directory
    shutil.copytree(ROOT, src / ROOT.name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("tensorstore_cache-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(site)  # a pure-Python wheel installs by unpacking
    modules = sorted(read_graph().lines)
    for module in modules:
        rel = module.replace(".", "/")
        assert f"{rel}.py" in names or f"{rel}/__init__.py" in names, module
    assert "tensorstore_cache/py.typed" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tensorstore-cache = tensorstore_cache.cli.main:main" in (site / entry).read_text()

    script = (
        "import importlib, json, sys\n"
        "mods = json.loads(sys.argv[1])\n"
        "files = {m: importlib.import_module(m).__file__ for m in mods}\n"
        "print(json.dumps(files))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, json.dumps(modules)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    files = json.loads(run.stdout)
    outside = {m: f for m, f in files.items() if not f.startswith(str(site))}
    assert outside == {}, "imported from somewhere else than the installed wheel"
