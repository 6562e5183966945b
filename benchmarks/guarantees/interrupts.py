"""How soon a build stops: Ctrl-C, a killed builder, a killed pool worker.

A building script (``python build.py``, in a session of its own, as a terminal runs it)
calls ``tsc.cached(keys, loader=Slow(...), workers=2)`` with a loader that takes
``delay`` seconds a call and logs each call. Once its process and its pool's worker are both
computing, one of these happens, and the time from it is measured:

- ``sigint``: SIGINT to the script's process group (a terminal's Ctrl-C, a notebook's
  interrupt): until its ``except KeyboardInterrupt`` runs (``handled_s``), and until it and
  every worker are gone (``stopped_s``);
- ``sigterm`` and ``sigkill`` to the script alone: until its workers, which check every 0.1 s
  that their builder lives, are gone (``stopped_s``);
- ``worker_killed``: SIGKILL to the pool's worker: until the build raises ``BuildError``
  (``handled_s``) and the script has exited (``stopped_s``).

``tests/test_guarantees/test_interrupts.py`` and ``test_worker_errors.py`` check what each
leaves behind; here only the time is measured.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

__all__ = ["EVENTS", "Slow", "gone", "measure", "mid_build"]

CHECKOUT = Path(__file__).resolve().parents[2]
GUARD_S = 120.0  # a guard against hangs, not a timing
EVENTS = ("sigint", "sigterm", "sigkill", "worker_killed")

_SCRIPT = '''
import os, signal, sys, time
import tensorstore_cache as tsc
from benchmarks.guarantees.interrupts import Slow

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
keys = [f"k{i}" for i in range(400)]
print("BUILDER", os.getpid(), flush=True)
try:
    tsc.cached(keys, cache_dir=sys.argv[1], loader=Slow(sys.argv[2], float(sys.argv[3])),
               loader_id="slow/1", workers=2, progress=False, identity="none")
except KeyboardInterrupt:
    print("HANDLED", time.time(), flush=True)
except tsc.BuildError:
    print("HANDLED", time.time(), flush=True)
'''


class Slow:
    """A loader of ``delay`` seconds a call that logs ``<pid> <key>`` as each call starts."""

    def __init__(self, log: str, delay: float) -> None:
        self.log, self.delay = log, delay

    def __call__(self, key: str) -> np.ndarray:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {key}\n".encode())
        finally:
            os.close(fd)
        time.sleep(self.delay)
        return np.zeros(4, np.float32)


def _pids(log: Path) -> set[int]:
    try:
        return {int(line.split()[0]) for line in log.read_text().splitlines() if line}
    except FileNotFoundError:
        return set()


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie waiting for its parent counts)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _wait(condition: Any, what: str) -> float:
    """Poll ``condition`` until true (every 5 ms); the time it became true."""
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"hang guard: {what} after {GUARD_S:g} s")
        time.sleep(0.005)
    return time.time()


def mid_build(proc: subprocess.Popen[str], log: Path) -> tuple[int, set[int]]:
    """Wait until the script's process and its pool's worker compute; their pids."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("BUILDER "):
        raise RuntimeError(f"the building script did not start: {line!r}")
    builder = int(line.split()[1])
    _wait(lambda: len(_pids(log)) >= 2 or proc.poll() is not None, "the build did not start")
    if proc.poll() is not None:
        raise RuntimeError("the building script exited before its worker computed")
    return builder, _pids(log) - {builder}


def _signal(event: str, proc: subprocess.Popen[str], builder: int, workers: set[int]) -> None:
    if event == "sigint":
        os.killpg(proc.pid, signal.SIGINT)
    elif event == "worker_killed":
        os.kill(next(iter(workers)), signal.SIGKILL)
    else:
        os.kill(builder, signal.SIGTERM if event == "sigterm" else signal.SIGKILL)


def _environment() -> dict[str, str]:
    """This environment, with the checkout importable (its workers unpickle :class:`Slow`)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(CHECKOUT) + (os.pathsep + path if path else "")}


def measure(event: str, work: Path, delay: float) -> dict[str, float]:
    """One build of ``work`` stopped by ``event`` (:data:`EVENTS`): its seconds until handled
    (``handled_s``, where the script handles it) and until every process is gone
    (``stopped_s``)."""
    work.mkdir(parents=True)
    (work / "build.py").write_text(_SCRIPT)
    log = work / "calls.log"
    proc = subprocess.Popen(
        [sys.executable, str(work / "build.py"), str(work / "cache"), str(log), str(delay)],
        cwd=CHECKOUT, env=_environment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        text=True, start_new_session=True)
    try:
        builder, workers = mid_build(proc, log)
        t0 = time.time()
        _signal(event, proc, builder, workers)
        out: dict[str, float] = {}
        if event in ("sigint", "worker_killed"):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("HANDLED "):
                raise RuntimeError(f"{event}: the script did not handle it: {line!r}")
            out["handled_s"] = float(line.split()[1]) - t0
        everyone = {builder, *workers}
        end = _wait(lambda: proc.poll() is not None and all(gone(p) for p in everyone),
                    f"{event}: processes of the build still alive")
        out["stopped_s"] = end - t0
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left of its session
        proc.communicate(timeout=GUARD_S)
