"""The matrix (``make test-matrix``) tests what ``pyproject.toml`` claims, and leaves out only
what needs torch.

- every lower bound of the package's dependencies and of the extras the matrix installs is
  pinned, at that release, in ``.ci/constraints-oldest.txt``, and nothing else is;
- no module the matrix collects (``pytest --without-torch``) imports torch when it is imported:
  such a module belongs to ``conftest.NEEDS_TORCH``, else the matrix fails to collect it;
- every entry of ``NEEDS_TORCH`` exists, and the tests refuse to start without torch unless
  told to leave it out;
- ``.ci/run`` runs the matrix beside ``make test``, and the matrix's suites hold every folder of
  tests that needs no torch (a new folder is not left out unnoticed); what it leaves to
  ``.venv`` is a few files of those folders, each there, and each named on the docs'
  Development page.
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
MATRIX_EXTRAS = ("pandas", "dask", "s3", "gcs", "azure")  # .ci/matrix's EXTRAS, the test tools aside


def bash_array(name: str) -> list[str]:
    """The words of the bash array ``name=(...)`` of ``.ci/matrix``, comments aside."""
    lines = (REPO / ".ci" / "matrix").read_text().splitlines()
    text = "\n".join(line.partition(" #")[0] for line in lines)
    found = re.search(rf"^{name}=\((.*?)\)", text, re.MULTILINE | re.DOTALL)
    assert found, f".ci/matrix assigns no array {name}"
    return found.group(1).split()


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
    extras = ",".join(MATRIX_EXTRAS)
    assert re.search(rf'^EXTRAS="{extras}"', (REPO / ".ci" / "matrix").read_text(), re.MULTILINE)
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert python == ">=3.11"  # the oldest Python of the matrix, .venv-3.11-oldest's


def test_the_torch_extra_starts_at_the_torch_the_tests_run() -> None:
    # the torch suites run on .venv's torch (the Makefile's pin) and on .venv-torchvision's
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (text,) = project["optional-dependencies"]["torch"]
    (low,) = [s.version for s in Requirement(text).specifier if s.operator == ">="]
    pins = re.findall(r"install --quiet torch==([\d.]+)", (REPO / "Makefile").read_text())
    assert pins and min(Version(v) for v in pins) == Version(low), (low, pins)
    assert f"torch >= {low}" in (REPO / "README.md").read_text()


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


def commands(path: Path) -> list[str]:
    """The lines of a shell script or recipe that run something: comments and echoes aside."""
    lines = [line.partition(" #")[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "echo"))]


def test_ci_runs_the_matrix_beside_make_test() -> None:
    run = commands(REPO / ".ci" / "run")
    assert any(re.search(r"\bmake\b.*\btest-matrix\b", line) for line in run), run
    assert any(re.search(r"\bmake test\b(?!-)", line) for line in run), run
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ntest-matrix:", 1)[1].split("\n\n", 1)[0]
    assert "bash .ci/matrix" in recipe
    assert "make test-matrix" in (REPO / "README.md").read_text()


def test_the_matrix_runs_every_folder_of_tests_that_needs_no_torch() -> None:
    suites, left_out = bash_array("SUITES"), bash_array("LEFT_OUT")
    assert "tensorstore_cache" in suites  # the doctests
    for suite in suites:
        assert (REPO / suite).is_dir(), f".ci/matrix's SUITES names {suite}, which is no folder"
    torch = needs_torch()
    folders = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py")}
    missing = [
        folder for folder in sorted(folders)
        if not any(folder == t or folder.startswith(f"{t}/") for t in torch)
        and not any(folder == s or folder.startswith(f"{s}/") for s in suites)
    ]
    assert missing == [], "add these to SUITES in .ci/matrix (or to conftest.NEEDS_TORCH)"
    assert "tests/unit" in suites and len(folders) > 8
    # what is left to .venv: files of those folders, each named on the Development page
    development = (REPO / "docs" / "development.md").read_text()
    assert left_out, "LEFT_OUT is empty: remove it rather"
    for entry in left_out:
        path, _, name = entry.partition("::")  # a file, or one test of it
        assert (REPO / path).is_file(), f".ci/matrix's LEFT_OUT names {path}, which is not there"
        assert any(path.startswith(f"{s}/") for s in suites), entry
        if name:
            assert f"def {name}(" in (REPO / path).read_text(), f"{entry}: no such test"
        assert f"{Path(path).name}`" in development, f"docs/development.md does not name {path}"
    assert len(left_out) == len(set(left_out))
