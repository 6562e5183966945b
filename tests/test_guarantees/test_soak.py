"""The cache's soak test (:mod:`tests.support.soak`), run as its users run a script.

A short soak (about a minute) runs in the suite; ``TSC_SOAK_SECONDS=600``
also runs a long one. Each asserts that the soak found no violation (its
report lists each kind with examples and tracebacks) and that it did
exercise the cache: calls were made and checked, gc ran, processes were
killed, sources were rewritten. Nothing is asserted about timings.
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

from ..support.soak import REPO

SHORT_S = 45.0
LONG_S = float(os.environ.get("TSC_SOAK_SECONDS") or 0)
GUARD_S = 900.0  # a guard against hangs on a loaded machine, not a timing assertion


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


def _soak(tmp_path: Path, seconds: float) -> dict[str, Any]:
    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.soak", "--seconds", str(seconds),
         "--workdir", str(tmp_path / "soak"), "--json", str(out)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: everything it starts, to check and kill
    )
    try:
        _out, err = proc.communicate(timeout=seconds + GUARD_S)
        deadline = time.monotonic() + 30
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


def _check(report: dict[str, Any], every_kill: bool = False) -> None:
    # it did exercise the cache (not a timing: any positive count will do)
    assert report["calls"] > 0 and report["vectors_checked"] > 0
    assert report["gc_runs"] > 0
    assert report["kills"]["total"] > 0
    if every_kill:  # a long run kills each kind of process (the killer picks them at random)
        kinds = ("builder_mid_build", "worker", "gc")
        assert all(report["kills"].get(k, 0) > 0 for k in kinds), report["kills"]
    assert report["writer"].get("rewrites", 0) > 0
    shown = json.dumps({"violations": report["violations"], "examples": report["examples"]},
                       indent=1)[:20000]
    assert report["violation_total"] == 0, shown
    assert report["exit"] == 0, report["stderr"]


@pytest.mark.timeout(SHORT_S + GUARD_S + 60)
def test_soak_short(tmp_path: Path) -> None:
    """About a minute: 4 callers, gc in a loop, a writer and a killer; no violation."""
    _check(_soak(tmp_path, SHORT_S))


@pytest.mark.skipif(not LONG_S, reason="set TSC_SOAK_SECONDS=600 to run the long soak")
@pytest.mark.timeout(LONG_S + GUARD_S + 60)
def test_soak_long(tmp_path: Path) -> None:
    """``TSC_SOAK_SECONDS`` long; its counts are printed (run with ``-s``)."""
    _check(_soak(tmp_path, LONG_S), every_kill=True)
