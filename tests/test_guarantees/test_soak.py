"""The cache's soak test (:mod:`tests.support.soak`), run as its users run a script.

A short soak (about a minute) runs in the suite; ``TSC_SOAK_SECONDS=600``
also runs a long one. Each asserts that the soak found no violation (its
report lists each kind with examples and tracebacks) and that it did
exercise the cache: calls were made and checked, gc ran, sources were
rewritten, and its killer, which follows a schedule, killed callers
mid-build, pool workers and gc, each at least once; its report is stamped
with the commit it ran. A short run with the cache sabotaged
(:mod:`tests.support._soak_sabotage`) must report violations: the soak's
checks can fail. Nothing is asserted about timings.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from benchmarks.common._stamp import FIELDS, machine, revision

from ..support._soak_killer import SCHEDULE
from ..support.soak import REPO

SHORT_S = 45.0
SABOTAGED_S = 20.0
LONG_S = float(os.environ.get("TSC_SOAK_SECONDS") or 0)
GUARD_S = 900.0  # a guard against hangs on a loaded machine, not a timing assertion
#: how long the soak's processes may take to be gone once it exited (it waited for every one
#: of them before it exited): a guard against hangs, not a timing assertion
EXIT_GUARD_S = 30.0


def _group(pgid: int) -> list[psutil.Process]:
    """Live processes of the process group ``pgid`` (the soak's session)."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _soak(tmp_path: Path, seconds: float, *options: str) -> dict[str, Any]:
    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.soak", "--seconds", str(seconds),
         "--workdir", str(tmp_path / "soak"), "--json", str(out), *options],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: everything it starts, to check and kill
    )
    try:
        _out, err = proc.communicate(timeout=seconds + GUARD_S)
        deadline = time.monotonic() + EXIT_GUARD_S
        while (left := _group(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes of the soak outlived it: {[p.cmdline() for p in left]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in _group(proc.pid):  # only ever the soak's own processes
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
    assert out.exists(), f"the soak wrote no report (exit {proc.returncode}):\n{err[-5000:]}"
    report: dict[str, Any] = json.loads(out.read_text())
    print(*[line for line in err.splitlines() if line.startswith("soak: ")], sep="\n")  # with -s
    return report | {"exit": proc.returncode, "stderr": err[-5000:]}


def _stamped(report: dict[str, Any], *options: str) -> None:
    stamp = report["stamp"]
    assert set(FIELDS) <= set(stamp), stamp
    assert stamp["commit"] == revision()[0] and isinstance(stamp["dirty"], bool)
    assert stamp["command"].startswith("python -m tests.support.soak --seconds ")
    assert all(o in stamp["command"].split() for o in options), stamp["command"]
    assert stamp["machine"] == machine(report["env"])


def _check(report: dict[str, Any]) -> None:
    # it did exercise the cache (not a timing: any positive count will do)
    assert report["calls"] > 0 and report["vectors_checked"] > 0
    assert report["gc_runs"] > 0
    # the killer's schedule: each kind in turn, so every run kills each at least once
    assert report["kill_schedule"] == list(SCHEDULE)
    kinds = ("builder", "builder_mid_build", "worker", "gc", "caller")
    assert all(report["kills"].get(k, 0) > 0 for k in kinds), report["kills"]
    assert report["writer"].get("rewrites", 0) > 0
    shown = json.dumps({"violations": report["violations"], "examples": report["examples"]},
                       indent=1)[:20000]
    assert report["violation_total"] == 0, shown
    assert report["exit"] == 0, report["stderr"]


@pytest.mark.timeout(SHORT_S + GUARD_S + 60)
def test_soak_short(tmp_path: Path) -> None:
    """About a minute: 4 callers, gc in a loop, a writer and a killer; no violation."""
    report = _soak(tmp_path, SHORT_S)
    _check(report)
    _stamped(report)


@pytest.mark.timeout(SABOTAGED_S + GUARD_S + 60)
def test_a_sabotaged_soak_reports_violations(tmp_path: Path) -> None:
    """The same soak with a cache that never finds a source changed: the callers' checks see
    stale vectors, the final check wrong ones, and the run fails."""
    report = _soak(tmp_path, SABOTAGED_S, "--sabotage", "stale")
    assert report["exit"] == 1, report["stderr"]
    assert report["violations"].get("stale", 0) > 0, report["violations"]
    assert report["violations"].get("final_wrong", 0) > 0, report["violations"]
    assert report["violation_total"] >= report["violations"]["stale"]
    assert report["calls"] > 0 and report["writer"].get("rewrites", 0) > 0
    _stamped(report, "--sabotage", "stale")


@pytest.mark.skipif(not LONG_S, reason="set TSC_SOAK_SECONDS=600 to run the long soak")
@pytest.mark.timeout(LONG_S + GUARD_S + 60)
def test_soak_long(tmp_path: Path) -> None:
    """``TSC_SOAK_SECONDS`` long; its counts are printed (run with ``-s``)."""
    report = _soak(tmp_path, LONG_S)
    _check(report)
    _stamped(report)
