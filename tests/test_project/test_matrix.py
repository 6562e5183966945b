"""The matrix (``make test-matrix``) tests what ``pyproject.toml`` claims, and leaves out only
what needs torch.

- every lower bound of the package's dependencies and of the extras the matrix installs is
  pinned, at that release, in ``.ci/constraints-oldest.txt``, and nothing else is;
- no module the matrix collects (``pytest --without-torch``) imports torch when it is imported:
  such a module belongs to ``conftest.NEEDS_TORCH``, else the matrix fails to collect it;
- every entry of ``NEEDS_TORCH`` exists, and the tests refuse to start without torch unless
  told to leave it out.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
MATRIX_EXTRAS = ("pandas", "dask", "s3")  # .ci/matrix's EXTRAS, the test tools aside


def needs_torch() -> tuple[str, ...]:
    """``NEEDS_TORCH`` as conftest.py assigns it."""
    tree = ast.parse((REPO / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "NEEDS_TORCH" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return value
    raise AssertionError("conftest.py assigns no NEEDS_TORCH")


def lower_bounds() -> dict[str, Version]:
    """The lower bound (``>=``) of each dependency and of each matrix extra's, by name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in MATRIX_EXTRAS:
        requirements += project["optional-dependencies"][extra]
    bounds: dict[str, Version] = {}
    for text in requirements:
        req = Requirement(text)
        (low,) = [s.version for s in req.specifier if s.operator == ">="]
        names = [req.name, *(["distributed"] if "distributed" in req.extras else [])]
        for name in names:
            assert bounds.setdefault(name, Version(low)) == Version(low), (name, bounds[name], low)
    return bounds


def test_the_oldest_constraints_pin_every_lower_bound() -> None:
    text = (REPO / ".ci" / "constraints-oldest.txt").read_text()
    bounds_part, tools_marker, tools_part = text.partition("# The tests' tools")
    assert tools_marker
    pins: list[dict[str, Version]] = []
    for part in (bounds_part, tools_part.partition("\n")[2]):
        lines = [line for line in part.splitlines() if line.strip() and not line.startswith("#")]
        pins.append({n.strip(): Version(v) for n, _, v in (ln.partition("==") for ln in lines)})
    assert pins[0] == lower_bounds()
    assert not set(pins[1]) & set(lower_bounds())
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert python == ">=3.11"  # the oldest Python of the matrix, .venv-3.11-oldest's


def test_the_readme_states_the_tested_pythons() -> None:
    readme = (REPO / "README.md").read_text()
    assert "Python 3.11 to 3.13 on Linux" in readme
    for minor in ("3.12", "3.13"):
        assert f'"{minor}:{minor}:"' in (REPO / ".ci" / "matrix").read_text()


def imports_torch_on_import(path: Path) -> bool:
    """Whether importing ``path`` imports torch: an import of it outside functions and classes."""
    tree = ast.parse(path.read_text(), str(path))
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            pending.extend(ast.iter_child_nodes(node))
            continue
        if any(re.fullmatch(r"(tensorstore_cache\.)?torch(\..*)?", n) for n in names):
            return True
    return False


def test_what_imports_torch_is_left_out_of_the_matrix() -> None:
    left_out = needs_torch()
    for entry in left_out:
        assert (REPO / entry).exists(), f"conftest.NEEDS_TORCH names {entry}, which is not there"
    collected = [
        p for root in ("tests", "tensorstore_cache") for p in sorted((REPO / root).rglob("*.py"))
        if not any(p.relative_to(REPO).as_posix().startswith(e) for e in left_out)
    ]
    assert len(collected) > 50
    importers = [str(p.relative_to(REPO)) for p in collected if imports_torch_on_import(p)]
    assert importers == [], "import torch in a function, or add these to conftest.NEEDS_TORCH"
    assert imports_torch_on_import(REPO / "tests/test_torch/test_torch.py")


def test_the_tests_refuse_to_start_without_torch(tmp_path: Path) -> None:
    # a Python without torch, as the matrix's venvs are: a None in sys.modules is a module that
    # cannot be imported, and that importlib.util.find_spec does not find
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               "tests/unit/test_config.py"]
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    refused = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode != 0
    assert "torch is not installed" in refused.stdout + refused.stderr
    allowed = subprocess.run([*command, "--without-torch"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
