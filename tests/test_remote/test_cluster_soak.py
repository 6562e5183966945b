"""The cluster soak's program (``tests/support/cluster_soak.py``): a short run, and its verdict.

The 5-minute run of 3 nodes x 2 agents is made by hand (``python -m tests.support.cluster_soak
--minutes 5``); here one round of 2 nodes x 1 agent runs for real, with its killer, and its
report is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster_soak import failures

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

REPO = Path(__file__).resolve().parents[2]


def test_a_short_soak_kills_holders_and_reports_stamped(tmp_path: Path) -> None:
    """One round: the killer SIGKILLs the lease holder, the other agents take over; the report
    is stamped (commit, command, machine, date) and shows 0 wrong vectors, no key computed
    three times, none left out, no failed agent, and a holder killed."""
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.cluster_soak", "--rounds", "1", "--new-keys", "30",
         "--nodes", "2", "--agents", "1", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert proc.returncode == 0 and report["failures"] == [], report
    assert report["rounds"] == 1 and report["killed"] == 1 and report["keys"] == 30
    assert (report["nodes"], report["agents_per_node"]) == (2, 1)
    assert report["wrong_vectors"] == 0 and report["keys_computed_three_times_or_more"] == 0
    stamp = report["stamp"]
    assert stamp["command"].startswith("python -m tests.support.cluster_soak --rounds 1")
    assert stamp["machine"] and stamp["date"] and "commit" in stamp


def test_a_soak_that_killed_nothing_fails() -> None:
    held = {"wrong_vectors": 0, "keys_computed_three_times_or_more": 0, "never_computed": 0,
            "failed_agents": 0, "killed": 3}
    assert failures(held) == []
    assert failures({**held, "killed": 0}) == [
        "no lease holder was killed: the soak proved nothing"]
    assert failures({**held, "wrong_vectors": 2, "never_computed": 1}) == [
        "2 wrong vectors", "1 never computed"]
