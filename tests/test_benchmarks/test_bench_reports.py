"""The committed benchmark reports name no directory of the machine that ran them.

Their commands, work directories and log paths are written relative to the
checkout or as ``<data>``, ``<workdir>``, ``<results>`` (see
:mod:`benchmarks.common._portable`), so that anyone can read and rerun them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common._portable import CHECKOUT, portable, rewrite_report

RESULTS = CHECKOUT / "benchmarks" / "results"
#: Absolute paths of the system itself, the same on every Linux machine.
SYSTEM = ("/proc/", "/sys/", "/dev/")
_ABSOLUTE = re.compile(r"(?<![\w.:/~<>-])/(?:[\w.+-]+/)*[\w.+-]+")
#: Directories that only ever name one machine's files.
_MACHINE = ("/tmp/", "/work/", "/home/", "/root/", "/Users/", "/mnt/", "/scratch/", "/var/")


def absolute_paths(text: str) -> list[str]:
    """The absolute paths in ``text`` but the system's own (``/proc/...``)."""
    found = [m.group(0) for m in _ABSOLUTE.finditer(text)]
    found += [d for d in _MACHINE if d in text]
    return sorted({p for p in found if not p.startswith(SYSTEM)})


def reports() -> list[Path]:
    return sorted([*RESULTS.glob("*/*.md"), *RESULTS.glob("*/*.json")])


def test_there_are_committed_reports() -> None:
    names = {p.name for p in reports()}
    assert {"latest.json", "latest.md", "sweep.json", "sweep.md", "micro.json"} <= names


@pytest.mark.parametrize("report", reports(), ids=lambda p: p.name)
def test_a_committed_report_names_no_directory_of_its_machine(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    assert absolute_paths(text) == [], f"{report.name}: write these as <workdir>, <data> or relative"


def test_the_scan_finds_what_it_looks_for() -> None:
    text = 'cmd --data /srv/x/d --log "/tmp/a b" --ok <workdir>/l.log /proc/vmstat 3/4 items/s'
    assert absolute_paths(text) == ["/srv/x/d", "/tmp/", "/tmp/a"]


def test_paths_become_relative_or_placeholders() -> None:
    checkout, work = Path("/src/tsc"), Path("/scratch/w")
    data = work / "data-200-s0"
    report = {
        "command": f"python -m benchmarks.run --workdir {work} --data {data} "
                   f"--results {checkout}/benchmarks/results",
        "config": {"workdir": str(work), "data": str(data), "results": str(checkout)},
        "log": f"{work}/trials/run1/trial-000.log",
        "error": f'  File "{checkout}/benchmarks/sweep/sweep_trial.py", line 3\n'
                 f'  File "{checkout}/.venv/lib/python3.11/site-packages/torch/x.py"',
        "near": [f"{work}x/other", f"{work}-2", f"/elsewhere{work}"],  # not the work directory
        str(data): (1, 2),
    }
    assert portable(report, checkout=checkout, data=data, workdir=work) == {
        "command": "python -m benchmarks.run --workdir <workdir> --data <data> "
                   "--results benchmarks/results",
        "config": {"workdir": "<workdir>", "data": "<data>", "results": "."},
        "log": "<workdir>/trials/run1/trial-000.log",
        "error": '  File "benchmarks/sweep/sweep_trial.py", line 3\n'
                 '  File ".venv/lib/python3.11/site-packages/torch/x.py"',
        "near": ["/scratch/wx/other", "/scratch/w-2", "/elsewhere/scratch/w"],
        "<data>": [1, 2],
    }


@pytest.mark.parametrize("results", ["benchmarks/results", "benchmarks/results/sweep"])
def test_a_report_written_before_is_rewritten_in_place(tmp_path: Path, results: str) -> None:
    # written by a checkout elsewhere into its results folder or a benchmark's folder in it:
    # that checkout's paths become relative, as this one's would
    ran = "/work/elsewhere"
    report = {
        "env": {"command": f"python -m benchmarks.sweep --data /data/covers --workdir /scratch/w "
                           f"--results {ran}/{results}"},
        "config": {"data": "/data/covers", "workdir": "/scratch/w", "results": f"{ran}/{results}"},
        "trial": {"log": "/scratch/w/trials/t.log", "error": f"File \"{ran}/benchmarks/x.py\""},
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    (tmp_path / "old.md").write_text(f"Command: `{report['env']['command']}`\n")
    rewrite_report(path)
    text = path.read_text()
    assert absolute_paths(text) == [] and absolute_paths((tmp_path / "old.md").read_text()) == []
    again = json.loads(text)
    assert again["env"]["command"] == ("python -m benchmarks.sweep --data <data> --workdir "
                                       f"<workdir> --results {results}")
    assert again["config"]["results"] == results
    assert again["trial"] == {"log": "<workdir>/trials/t.log", "error": 'File "benchmarks/x.py"'}
    assert text == json.dumps(again, indent=1) + "\n"  # the file's layout is kept
    assert (tmp_path / "old.md").read_text() == f"Command: `{again['env']['command']}`\n"


def test_the_rewriting_command_takes_reports_and_refuses_a_missing_one(tmp_path: Path) -> None:
    ran = "/work/elsewhere/benchmarks/results/micro"
    path = tmp_path / "micro.json"
    path.write_text(json.dumps({"config": {"results": ran}, "out": f"{ran}/micro.json"}))
    command = [sys.executable, "-m", "benchmarks.common._portable"]
    done = subprocess.run([*command, str(path)], cwd=CHECKOUT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"rewrote {path}\n"
    assert json.loads(path.read_text())["out"] == "benchmarks/results/micro/micro.json"
    refused = subprocess.run([*command, str(path), str(tmp_path / "nope.json")], cwd=CHECKOUT,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and f"no such report: {tmp_path / 'nope.json'}" in refused.stderr
