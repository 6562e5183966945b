"""The tests and the benchmarks are laid out by area, and every program the docs name runs.

- ``tests/`` holds at most 12 entries: folders of suites, ``support/``, ``data/``, its
  ``__init__.py`` and ``conftest.py``; no test module at its top, and no folder named
  ``torch`` anywhere in it (with ``tests/`` on ``sys.path`` it would shadow the real package);
- ``benchmarks/`` holds a folder per benchmark and no module at its top but its
  ``__init__.py``: each folder but ``common/``, ``results/`` and ``requirements/`` runs as
  ``python -m benchmarks.<name>``;
- every ``python -m benchmarks.<...>`` and ``python -m tests.support.<...>`` that the README,
  the docs, ``benchmarks/README.md`` or the Makefile names answers ``--help``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: What names the programs: the pages users and developers read, and the Makefile.
NAMING = ("README.md", "DEVELOPERS.md", "docs/*.md", "benchmarks/README.md", "Makefile")
#: ``python -m`` and a module of the benchmarks or of the tests' programs (a line may break
#: between the two: the pages are wrapped), and the interpreter named before it, if any
_COMMAND = re.compile(
    r"(\S*/)?python\s+-m\s+((?:benchmarks|tests\.support)(?:\.[A-Za-z_]\w*)*)")
#: The environments a page may run a program with besides .venv's: torchvision's
#: (``make test-torchvision`` sets it up while the main run goes on, so it may not be there yet;
#: without it, such a program says where to run it)
OTHER_VENVS = (".venv-torchvision/bin/",)
#: A command of a ``--help``; a fresh interpreter each, so few at once on a loaded machine.
_AT_ONCE = 4


def entries(folder: Path) -> list[str]:
    """What a clean checkout holds in ``folder``: byte-compiled files and hidden ones aside."""
    return sorted(p.name for p in folder.iterdir()
                  if p.name != "__pycache__" and not p.name.startswith("."))


def test_tests_hold_a_few_folders_by_area_and_no_loose_test_module() -> None:
    top = entries(REPO / "tests")
    assert len(top) <= 12, top
    files = [name for name in top if (REPO / "tests" / name).is_file()]
    assert files == ["__init__.py", "conftest.py"], "a suite goes into its area's folder"
    assert {"support", "data", "unit"} <= set(top)
    for name in set(top) - {"support", "data", "unit"} - set(files):
        assert name.startswith("test_"), f"tests/{name}: an area's folder is tests/test_<area>/"
        assert (REPO / "tests" / name / "__init__.py").is_file(), f"tests/{name} is no package"
    shadows = [p for p in (REPO / "tests").rglob("torch") if p.is_dir()]
    assert shadows == [], "a folder named torch shadows the real package: name it test_torch"


def test_benchmarks_hold_a_folder_per_benchmark() -> None:
    top = entries(REPO / "benchmarks")
    files = [name for name in top if (REPO / "benchmarks" / name).is_file()]
    assert files == ["README.md", "__init__.py"], "a helper goes into its benchmark's folder"
    programs = set(top) - set(files) - {"common", "results", "requirements"}
    assert {"run", "sweep", "records", "embed"} <= programs
    for name in programs:
        assert (REPO / "benchmarks" / name / "__main__.py").is_file(), name
    assert {p.name for p in (REPO / "benchmarks" / "results").iterdir()} <= programs | {"soak"}


def named_programs() -> dict[str, tuple[str, list[str]]]:
    """Each module the pages and the Makefile run with ``python -m``: the environment they
    run it with (``.venv/bin/`` unless one of :data:`OTHER_VENVS`) and where it is named."""
    found: dict[str, tuple[str, list[str]]] = {}
    for pattern in NAMING:
        for path in sorted(REPO.glob(pattern)):
            for prefix, module in _COMMAND.findall(path.read_text(encoding="utf-8")):
                venv, places = found.get(module, (".venv/bin/", []))
                if prefix.removeprefix("./") in OTHER_VENVS:
                    venv = prefix.removeprefix("./")
                found[module] = (venv, [*places, str(path.relative_to(REPO))])
    return found


def test_the_pages_name_programs_found_in_every_form() -> None:
    # a command broken across lines, as the pages wrap it, counts too; a placeholder does not
    assert _COMMAND.findall("`python -m\nbenchmarks.sweep.sweep_trial`, python -m benchmarks.<x>, "
                            ".venv-torchvision/bin/python -m benchmarks.fingerprint") == [
        ("", "benchmarks.sweep.sweep_trial"), ("", "benchmarks"),
        (".venv-torchvision/bin/", "benchmarks.fingerprint")]
    found = named_programs()
    assert {"benchmarks.run", "benchmarks.records", "benchmarks.common._portable",
            "tests.support.soak"} <= set(found)
    assert found["benchmarks.run"][0] == ".venv/bin/"


def _help(module: str, venv: str) -> subprocess.Popen[str]:
    python = REPO / venv / "python"
    command = [str(python) if python.exists() else sys.executable, "-m", module, "--help"]
    return subprocess.Popen(command, cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_every_program_the_pages_name_answers_help() -> None:
    # `python -m benchmarks` with nothing after it is a placeholder (python -m benchmarks.<name>)
    named = named_programs()
    programs = sorted(set(named) - {"benchmarks", "benchmarks.common"})
    failures: list[str] = []
    for start in range(0, len(programs), _AT_ONCE):
        running = {module: _help(module, named[module][0])
                   for module in programs[start:start + _AT_ONCE]}
        for module, process in running.items():
            out, err = process.communicate(timeout=120)
            venv = named[module][0]
            # an environment not set up yet: the program refuses, naming the one to run it with
            missing = venv != ".venv/bin/" and not (REPO / venv / "python").exists()
            if missing and process.returncode != 0 and venv.removesuffix("/bin/") in err:
                continue
            if process.returncode != 0 or "usage:" not in out:
                where = ", ".join(sorted(set(named[module][1])))
                failures.append(f"{venv}python -m {module} --help (named in {where}): exit "
                                f"{process.returncode}\n{err[-600:]}")
    assert failures == [], "\n".join(failures)
