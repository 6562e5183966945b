"""Every committed results file names the run that measured it.

A results file is a report, ``NAME.json``, stamped (:mod:`benchmarks.common._stamp`: the
commit and whether the tree was dirty, the command, the machine line and the date; each
method's own where a run was resumed), with its table ``NAME.md`` ending with the stamp's
line, and the plots it drew (``NAME-<plot>.png``, ``NAME_timeline.png``; the main
benchmark's ``latest`` plots keep their plain names). Nothing else is a results file, and
none is excused: a result measured before runs were stamped is measured again, or removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.common._stamp import unstamped

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def results_files() -> list[str]:
    return sorted(str(p.relative_to(RESULTS)) for p in RESULTS.glob("*/*") if p.is_file())


def _owner(plot: Path) -> Path | None:
    """The report a plot belongs to: the results name its file name starts with."""
    names = [p.stem for p in plot.parent.glob("*.json")]
    for name in sorted(names, key=len, reverse=True):
        if plot.stem.startswith((f"{name}-", f"{name}_")):
            return plot.parent / f"{name}.json"
    return plot.parent / "latest.json" if (plot.parent / "latest.json").exists() else None


def problems(path: Path) -> list[str]:
    """What keeps the results file ``path`` from naming the run behind it."""
    if path.suffix == ".png":
        owner = _owner(path)
        return [] if owner is not None and owner.exists() else ["a plot of no report"]
    if path.suffix == ".md":
        if not path.with_suffix(".json").exists():
            return ["a table without its report (NAME.json)"]
        last = path.read_text(encoding="utf-8").rstrip().splitlines()[-1]
        report = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        if unstamped(report):
            return ["the table of an unstamped report"]
        return [] if last.startswith(("Measured at ", "Methods measured at different code: ")) \
            else [f"the table does not end with its stamp's line: {last[:80]!r}"]
    if path.suffix != ".json":
        return ["not a report: every results file is NAME.json (and its NAME.md)"]
    missing = unstamped(json.loads(path.read_text(encoding="utf-8")))
    return [f"{', '.join(missing)} not stamped"] if missing else []


def test_there_are_results() -> None:
    assert "run/latest.json" in results_files()


@pytest.mark.parametrize("rel", results_files())
def test_every_results_file_names_its_run(rel: str) -> None:
    found = problems(RESULTS / rel)
    assert not found, f"{rel}: {'; '.join(found)}"


def test_what_does_not_name_its_run_is_found(tmp_path: Path) -> None:
    stamp = {"commit": "a" * 40, "dirty": False, "command": "python -m benchmarks.micro",
             "machine": "m", "date": "2026-12-06"}
    (tmp_path / "ok.json").write_text(json.dumps({"stamp": stamp, "methods": {"a": {"stamp": stamp}}}))
    (tmp_path / "ok.md").write_text("# t\n\nMeasured at commit aaaaaaaaaaaa: `python -m x`; m; d.\n")
    (tmp_path / "ok-plot.png").write_bytes(b"\x89PNG")
    (tmp_path / "bare.json").write_text(json.dumps({"figures": {}}))
    (tmp_path / "resumed.json").write_text(json.dumps({"stamp": stamp, "methods": {"a": {}}}))
    (tmp_path / "cut.json").write_text(json.dumps({"stamp": {**stamp, "commit": None}}))
    (tmp_path / "loose.md").write_text("# t\n")
    (tmp_path / "ok2.json").write_text(json.dumps({"stamp": stamp}))
    (tmp_path / "ok2.md").write_text("# t\n| a |\n")
    (tmp_path / "notes.txt").write_text("a run\n")
    (tmp_path / "orphan-plot.png").write_bytes(b"\x89PNG")
    assert problems(tmp_path / "ok.json") == problems(tmp_path / "ok.md") == []
    assert problems(tmp_path / "ok-plot.png") == []
    assert problems(tmp_path / "bare.json") == ["stamp not stamped"]
    assert problems(tmp_path / "resumed.json") == ["methods.a not stamped"]
    assert problems(tmp_path / "cut.json") == []  # run outside a git checkout: said so
    assert problems(tmp_path / "loose.md") == ["a table without its report (NAME.json)"]
    assert problems(tmp_path / "ok2.md")[0].startswith("the table does not end with its stamp")
    assert problems(tmp_path / "notes.txt")[0].startswith("not a report")
    assert problems(tmp_path / "orphan-plot.png") == ["a plot of no report"]
