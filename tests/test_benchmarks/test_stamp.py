"""Every results file records the code it measured: commit, dirty tree, command, machine, date.

The stamp of a run (:mod:`benchmarks.common._stamp`) is taken from a real git checkout; a
resumed run keeps each method's stamp from the run that measured it, and a results file
without a stamp is never written.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common._report import environment, publish
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import CHECKOUT, footer, revision, run_stamp, stamp

ENV = {"cpu": "Some CPU", "cores": 2, "ram_bytes": 24 * 2**30, "python": "3.11.7",
       "date": "2026-12-02T06:42:10+00:00"}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout with a module and a committed results file."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results" / "micro").mkdir(parents=True)
    (repo / "lib.py").write_text("x = 1\n")
    (repo / "benchmarks" / "results" / "micro" / "micro.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def test_the_stamp_names_the_commit_and_whether_the_tree_was_dirty(checkout: Path) -> None:
    head = _git(checkout, "rev-parse", "HEAD")
    assert revision(checkout) == (head, False)
    (checkout / "benchmarks" / "results" / "micro" / "micro.json").write_text('{"a": 1}\n')
    assert revision(checkout) == (head, False)  # a rerun's own results: not the code
    (checkout / "lib.py").write_text("x = 2\n")
    assert revision(checkout) == (head, True)
    _git(checkout, "checkout", "-q", "lib.py")
    (checkout / "new.py").write_text("y = 1\n")  # a new file the run imports
    assert revision(checkout) == (head, True)


def test_outside_a_git_checkout_the_commit_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    assert revision(tmp_path / "plain") == (None, None)
    run = run_stamp("benchmarks.micro", ["--quick"], ENV, checkout=tmp_path / "plain")
    assert run == {"commit": None, "dirty": None, "command": "python -m benchmarks.micro --quick",
                   "machine": "Some CPU, 2 cores, 24 GiB RAM, Python 3.11.7",
                   "date": ENV["date"]}


def test_this_checkout_is_stamped_with_its_head() -> None:
    env = environment()
    run = run_stamp("benchmarks.run", ["--quick"], env)
    assert run["commit"] == _git(CHECKOUT, "rev-parse", "HEAD")
    assert isinstance(run["dirty"], bool)
    assert run["machine"].startswith(f"{env['cpu']}, {env['cores']} cores")
    assert run["date"] == env["date"]


def _run(commit: str, date: str) -> dict[str, Any]:
    return {"commit": commit, "dirty": False, "command": "python -m benchmarks.run --resume",
            "machine": "m", "date": date}


def test_a_resumed_run_keeps_the_stamp_of_each_method(tmp_path: Path) -> None:
    files = ResultsFile(tmp_path, "run")
    first, later = _run("a" * 40, "2026-12-01"), _run("b" * 40, "2026-12-02")
    report: dict[str, Any] = {"methods": {"no_cache": {"s": 1.0}}}
    publish(files, report, lambda r: "# table\n", first)
    assert json.loads(files.json.read_text())["methods"]["no_cache"]["stamp"] == first
    assert "different code" not in files.md.read_text()

    resumed = files.load()
    assert resumed is not None
    resumed["methods"]["raw_memmap"] = {"s": 2.0}
    publish(files, resumed, lambda r: "# table\n", later)
    written = json.loads(files.json.read_text())
    assert written["stamp"] == first  # the run that began the file
    assert written["methods"]["no_cache"]["stamp"] == first
    assert written["methods"]["raw_memmap"]["stamp"] == later
    table = files.md.read_text()
    assert table.startswith("# table\n")
    assert f"Measured at commit {'a' * 12}: `python -m benchmarks.run --resume`" in table
    assert (f"no_cache at commit {'a' * 12} (2026-12-01); raw_memmap at commit {'b' * 12} "
            "(2026-12-02)") in table


def test_an_unstamped_report_is_never_written(tmp_path: Path) -> None:
    files = ResultsFile(tmp_path, "micro")
    with pytest.raises(ValueError, match=r"micro\.json: stamp not stamped"):
        files.save({"env": {}}, "# table\n")
    report = stamp({"methods": {}}, _run("c" * 40, "2026-12-03"))
    report["methods"]["late"] = {"s": 1.0}  # measured after the report was stamped
    with pytest.raises(ValueError, match=r"methods\.late not stamped"):
        files.save(report, "# table\n")
    assert not files.json.exists() and not files.md.exists()


def test_the_footer_says_when_the_tree_was_dirty() -> None:
    dirty = dict(_run("d" * 40, "2026-12-04"), dirty=True)
    assert f"commit {'d' * 12} with uncommitted changes" in footer({"stamp": dirty})
    assert "no git checkout" in footer({"stamp": dict(dirty, commit=None, dirty=None)})
