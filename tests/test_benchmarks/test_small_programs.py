"""The benchmark programs without a smoke test of their own, run tiny, end to end.

Each runs as ``python -m benchmarks.<name>`` on a few items and must write its results,
stamped with the run (:mod:`benchmarks.common._stamp`), into ``--results``: the JSON with
its figures and the command, the table ending with the stamp's line, no directory of this
machine in either. What each measures is not judged here (nothing about timings).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common._stamp import unstamped

from .test_bench_reports import absolute_paths

for _module in ("torch", "datasets", "moto.server", "s3fs"):
    pytest.importorskip(_module)  # the benchmarks' extra dependencies

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 600  # a guard against hangs on a loaded machine, not a timing assertion

#: module, its tiny arguments, the results name, the figures the report must hold
PROGRAMS: list[tuple[str, list[str], str, list[str]]] = [
    ("benchmarks.micro", ["--quick", "--images", "120", "--open-sizes", "200,400"], "micro",
     ["build", "open", "access", "covers"]),
    ("benchmarks.scale", ["--images", "40", "--keys", "2000", "--metadata-images", "100000"],
     "scale", ["loader_float32_items_per_cpu_s", "meta100000_uint8_2w_group_json_bytes",
               "index2000_open_ms_wall"]),
    ("benchmarks.remote", ["--n", "300", "--repeat", "1", "--quick"], "remote",
     ["first_batch", "fraction", "capped"]),
    ("benchmarks.torch_batching", ["--items", "600", "--repeat", "1", "--workers", "0",
                                   "--perm-sizes", "1000"], "torch_batching",
     ["batching_items_per_s", "augment_items_per_s", "permutation_s"]),
    ("benchmarks.run.hf_features", ["--items", "300"], "hf-features",
     ["fixed-size list", "Array3D"]),
    ("benchmarks.guarantees", ["--rounds", "1", "--delay", "0.2", "--parts", "stopping"],
     "guarantees", []),
    ("benchmarks.cold.cold_timeline", ["--images", "150", "--rounds", "1"], "timeline",
     ["rounds"]),
    ("benchmarks.cold.first_read", ["--sizes", "300", "--rounds", "1"], "first-read",
     ["stores"]),
    ("benchmarks.cold.compare", [".", ".", "--images", "400", "--rounds", "1"], "compare",
     ["checkouts"]),
]


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = report.get("figures", report)
    return figures


@pytest.mark.timeout(HANG_GUARD_S + 60)
@pytest.mark.parametrize(("module", "args", "name", "figures"), PROGRAMS,
                         ids=[p[0].removeprefix("benchmarks.") for p in PROGRAMS])
def test_a_program_writes_its_results_stamped(tmp_path: Path, module: str, args: list[str],
                                              name: str, figures: list[str]) -> None:
    results, work = tmp_path / "results", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "--workdir", str(work), "--results", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-5000:]
    text = (results / f"{name}.json").read_text()
    report = json.loads(text)
    assert unstamped(report) == []
    assert report["stamp"]["command"] == " ".join(
        ["python", "-m", module, *args, "--workdir", "<workdir>", "--results", "<results>"])
    assert all(key in _figures(report) for key in figures), list(_figures(report))
    table = (results / f"{name}.md").read_text()
    assert table.rstrip().splitlines()[-1].startswith("Measured at commit ")
    assert absolute_paths(text) == [] and absolute_paths(table) == []
