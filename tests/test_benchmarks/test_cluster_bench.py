"""The copied-sources benchmark (``python -m benchmarks.cluster``) end to end, tiny."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.cluster.copied import main


def test_copied_sources_benchmark(tmp_path: Path) -> None:
    """Every figure is measured and stamped; node B reads each copied source once on its first
    call and none on its second."""
    assert main(["--images", "40", "--build-images", "30", "--rounds", "1",
                 "--work", str(tmp_path), "--results", str(tmp_path / "results")]) == 0
    report = json.loads((tmp_path / "results" / "latest.json").read_text())
    copied, build = report["copied"], report["build"]
    assert copied["first_call_source_reads"] == 40 and copied["second_call_source_reads"] == 0
    assert copied["rebuild_s"] > 0 and copied["first_call_s"] > 0
    assert len(build["runs_s"]["stat"]) == len(build["runs_s"]["content"]) == 1
    assert report["stamp"]["command"].startswith("python -m benchmarks.cluster")
    assert "Measured at" in (tmp_path / "results" / "latest.md").read_text()
