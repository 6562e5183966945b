"""The stamped timeline of cold builds (``python -m benchmarks.cold.cold_timeline``) runs and
stamps every stage of the building process, with the CPU each process had used."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common._timeline import caller, event_lines

pytest.importorskip("pandas")  # the records' inputs are read with it

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_cold_timeline_stamps_both_builds_with_their_cpu(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cold.cold_timeline", "--images", "80", "--rounds", "1",
         "--workdir", str(tmp_path / "work"), "--results", str(tmp_path / "results")],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "timeline.json").read_text())
    assert len(report["env"]["loadavg_at_start"]) == 3  # the load is written with the events
    table = (tmp_path / "results" / "timeline.md").read_text()
    assert re.match(r"Load average at the start: [\d.]+, [\d.]+, [\d.]+\.\n", table), table
    builds = proc.stdout.split("\nround 1, ")[1:]
    assert [b.split(":", 1)[0] for b in builds] == ["covers", "records"]
    for build in builds:
        events = event_lines(build)
        assert all(cpu is not None for _t, _pid, cpu, _what in events), build
        times = [t for t, _pid, _cpu, _what in events]
        assert times == sorted(times), build
        builder = caller(events)
        mine = [(cpu, what) for _t, pid, cpu, what in events if pid == builder and cpu is not None]
        assert mine[0][1] == "call" and mine[-1][1] == "returned", build
        assert [c for c, _w in mine] == sorted(c for c, _w in mine), build  # CPU only grows
        what = [w for _c, w in mine]
        for stage in ("publish started", "publish returned"):
            assert stage in what, (stage, build)
        everyone = [w for _t, _pid, _cpu, w in events]  # a small build: one process may do all
        assert "first item" in everyone, build
        assert any(w.startswith("last stamped item (item ") for w in everyone), build
        assert re.search(r"^CPU: building process [\d.]+ s during the call, the workers it "
                         r"reaped [\d.]+ s$", build, re.M), build
    assert not (tmp_path / "work" / "build").exists()  # the stores are removed
