"""A build's workers forked from the building process where that is safe, fresh elsewhere.

Real scripts (``python build.py``) build 150 covers with ``workers=3``, so that a pool of two
workers computes beside the building process. The loader logs each call with its process
and whether that process holds what the script defined before the build (a global of its
``__main__``), which only a forked worker inherits:

* a script that runs no other thread forks its workers, with a progress bar too (its
  thread starts after the pool): they hold it, and they are gone when the build returns;
* a script whose thread still runs (as a notebook kernel's, or a metrics thread), or run
  with ``TSC_WORKER_START=spawn``, starts fresh interpreters, which do not;
* either way the store has the same vectors, each computed once; the script's buffered
  output is printed once and its exit handlers run once (the forked workers neither
  flush the copies they hold nor run them);
* a forked worker does not run the script's own signal handlers: SIGTERM kills it, as it
  kills a fresh one, and the build fails naming the signal;
* ``TSC_WORKER_START`` set to anything else fails the build with a message naming it.

The interrupts (Ctrl-C, SIGTERM) of forked and fresh workers are in ``test_interrupts.py``;
:class:`~tensorstore_cache.writer.forked.Forked`, the forked worker's process handle, is
tested on a real child here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from tensorstore_cache import config
from tensorstore_cache.writer.forked import Forked, fork_allowed

from ..support._clients import calls, environment, expected, python

GUARD_S = 120  # a guard against hangs, not a timing assertion

_SCRIPT = '''
import atexit
import os
import signal
import sys
import threading

import numpy as np

import tensorstore_cache as tsc
from tests.support._clients import LoggedImages, log_call

DEFINED_BEFORE_THE_BUILD = True


BUILDER = os.getpid()
open(PID, "w").write(str(BUILDER))


class Marks(LoggedImages):
    """Logs each call, and whether its process holds this script's global; the building
    process waits, at its first call, until both workers computed (none is left out)."""

    def __call__(self, path):
        import __main__
        import time

        from tests.support._clients import calls

        log_call(MARKS, str(hasattr(__main__, "DEFINED_BEFORE_THE_BUILD")))
        deadline = time.monotonic() + 60
        while WAIT and os.getpid() == BUILDER and time.monotonic() < deadline:
            if len({pid for pid, _ in calls(MARKS)} - {BUILDER}) >= 2:
                break
            time.sleep(0.01)
        if TERM and os.getpid() == BUILDER and not os.path.exists(TERMED):
            open(TERMED, "w").close()  # once: one worker gets SIGTERM from outside
            os.kill(min({pid for pid, _ in calls(MARKS)} - {BUILDER}), signal.SIGTERM)
        return super().__call__(path)


atexit.register(lambda: log_call(EXITS, "exit handler"))
if TERM:  # this script's own SIGTERM handler, which its workers must not run
    signal.signal(signal.SIGTERM, lambda *_: log_call(EXITS, "SIGTERM handler"))
if THREAD:
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
print("BUFFERED", end=" ")  # not flushed: stdout is a pipe (and PYTHONUNBUFFERED is unset)
paths = open(PATHS).read().splitlines()
store = tsc.cached(paths, cache_dir=CACHE, loader=Marks(LOG), workers=3, progress=PROGRESS)
import psutil

print("CHILDREN", len(psutil.Process().children(recursive=True)))
np.save(OUT, store.stack(paths))
'''


def _build(tmp_path: Path, paths: list[str], thread: bool = False, wait: bool = True,
           env: dict[str, str] | None = None, progress: bool = False,
           term: bool = False) -> subprocess.CompletedProcess[str]:
    listing = tmp_path / "paths.txt"
    listing.write_text("\n".join(paths))
    names = {name: str(tmp_path / f) for name, f in [
        ("PATHS", "paths.txt"), ("CACHE", "cache"), ("LOG", "calls.log"), ("MARKS", "marks.log"),
        ("EXITS", "exits.log"), ("OUT", "out.npy"), ("PID", "builder.pid"),
        ("TERMED", "termed")]}
    header = "".join(f"{k} = {v!r}\n" for k, v in names.items()) + f"THREAD, WAIT, PROGRESS, TERM = {thread}, {wait}, {progress}, {term}\n"
    (tmp_path / "build.py").write_text(header + _SCRIPT)
    return subprocess.run([python(), "build.py"], cwd=tmp_path, env=environment(**{"PYTHONUNBUFFERED": "", **(env or {})}),
                          capture_output=True, text=True, timeout=GUARD_S, check=False)


@pytest.mark.parametrize(
    "how", ["no thread", "no thread, a progress bar", "a thread runs", "TSC_WORKER_START=spawn"])
def test_workers_fork_only_from_a_process_without_threads(
    tmp_path: Path, client_images: list[str], how: str
) -> None:
    env = {config.WORKER_START_ENV: "spawn"} if "spawn" in how else {}
    done = _build(tmp_path, client_images, thread=how == "a thread runs", env=env,
                  progress="progress" in how)
    assert done.returncode == 0, done.stderr
    builder = int((tmp_path / "builder.pid").read_text())
    marks: dict[int, set[str]] = {}
    for pid, marked in calls(tmp_path / "marks.log"):
        marks.setdefault(pid, set()).add(marked)
    workers = set(marks) - {builder}
    assert len(workers) == 2, marks  # the building process and both workers computed
    forked = how.startswith("no thread")  # the bar's thread starts after the pool
    assert marks[builder] == {"True"}
    assert all(marks[pid] == {str(forked)} for pid in workers), marks
    # the same vectors, each computed once; no worker left; output and exit handlers once
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected(client_images))
    assert sorted(key for _pid, key in calls(tmp_path / "calls.log")) == sorted(client_images)
    assert done.stdout.split() == ["BUFFERED", "CHILDREN", "0"], done.stdout
    assert [key for _pid, key in calls(tmp_path / "exits.log")] == ["exit handler"]
    assert "Traceback" not in done.stderr, done.stderr


def test_a_forked_worker_does_not_run_the_callers_signal_handlers(
    tmp_path: Path, client_images: list[str]
) -> None:
    done = _build(tmp_path, client_images, term=True)  # SIGTERM to a worker mid-build
    assert done.returncode == 1
    assert "died by signal 15 (SIGTERM)" in done.stderr, done.stderr
    assert [key for _pid, key in calls(tmp_path / "exits.log")] == ["exit handler"]


def test_an_unknown_worker_start_fails_the_build_naming_it(
    tmp_path: Path, client_images: list[str]
) -> None:
    done = _build(tmp_path, client_images, wait=False,
                  env={config.WORKER_START_ENV: "forkserver"})
    assert done.returncode == 1
    assert "ValueError: $TSC_WORKER_START must be 'auto' or 'spawn', got 'forkserver'" in (
        done.stderr), done.stderr
    assert "CHILDREN" not in done.stdout  # the build failed before a pool started


def test_fork_allowed_follows_the_threads_cuda_and_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(config.WORKER_START_ENV, raising=False)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    assert fork_allowed() is (sys.platform == "linux")
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # another thread runs
    assert fork_allowed() is False
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    for value, allowed in [("spawn", False), (" Spawn ", False), ("auto", True), ("", True)]:
        monkeypatch.setenv(config.WORKER_START_ENV, value)
        assert fork_allowed() is (allowed and sys.platform == "linux"), value
    monkeypatch.setenv(config.WORKER_START_ENV, "fork")
    with pytest.raises(ValueError, match=r"\$TSC_WORKER_START must be 'auto' or 'spawn'"):
        fork_allowed()
    monkeypatch.delenv(config.WORKER_START_ENV)
    for initialized in (True, False):  # a torch that has initialized CUDA, or not
        fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda i=initialized: i))
        monkeypatch.setitem(sys.modules, "torch", fake)
        assert fork_allowed() is (not initialized and sys.platform == "linux")


def test_a_forked_workers_handle_polls_waits_and_kills_a_real_child() -> None:
    pid = os.posix_spawn("/bin/sleep", ["sleep", "60"], dict(os.environ))
    child = Forked(pid)
    try:
        assert child.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.05)
        child.kill()
        assert child.wait(GUARD_S) == -signal.SIGKILL
        assert child.poll() == -signal.SIGKILL
        child.kill()  # reaped: nothing is signalled (its pid may be another's by now)
    finally:
        if child.returncode is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    done = Forked(os.posix_spawn("/bin/sh", ["sh", "-c", "exit 3"], dict(os.environ)))
    assert done.wait() == 3
