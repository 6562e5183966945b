"""``make test`` (plain ``pytest``) runs the examples of the package's docstrings."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pytest_collects_the_package_and_its_doctests() -> None:
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "tensorstore_cache" in options["testpaths"]
    # what the configuration does, not what it says: the examples are collected as tests
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tensorstore_cache/loaders.py", "tensorstore_cache/format/keys.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for item in ("tensorstore_cache/loaders.py::tensorstore_cache.loaders.to_float32",
                 "tensorstore_cache/format/keys.py::tensorstore_cache.format.keys.normalize_key"):
        assert item in proc.stdout, proc.stdout
