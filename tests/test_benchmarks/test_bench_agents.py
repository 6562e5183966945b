"""The main benchmark's agents time what the method does: a load starts right after a full
collection of the garbage collector (``benchmarks/run/_agent.py``), so that a collection the
agent's own setup made due does not land inside a short load and traverse its list of every
path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..support._probe_methods import PROBE_DIR

REPO = Path(__file__).resolve().parents[2]
PROBE = "tests.support._probe_methods:GC_AT_LOAD"


@pytest.mark.timeout(300)
def test_a_load_starts_right_after_a_full_collection(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--workdir", str(tmp_path / "work"),
         "--results", str(tmp_path / "results"), "--out", "probe", "--methods", PROBE,
         "--agents", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=280,
        env={**os.environ, PROBE_DIR: str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts = [json.loads(p.read_text()) for p in tmp_path.glob("gc-*.json")]
    assert len(counts) >= 3, counts  # the first agents' loads and the later agents'
    # the counts of collections since the last older one are 0 only right after a full
    # collection: the imports before it made dozens of collections
    assert all(c[1] == 0 and c[2] == 0 and c[0] < 100 for c in counts), counts
