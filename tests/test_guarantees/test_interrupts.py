"""Ctrl-C and SIGTERM sent to a real process in the middle of a build with ``workers=2``.

The builder is a script started in its own session; its loader takes 0.2 s
a call and logs each call, so the test waits until the building process
and the worker of its pool are both computing, then signals:

* SIGINT to the process alone (``kill``) and to its process group
  (``killpg``, as a terminal's Ctrl-C does, and a Jupyter interrupt:
  jupyter_client signals the kernel's process group): the script's
  ``except KeyboardInterrupt`` runs, no worker survives, the
  build lock is free, nothing is published, no temporary directory is left,
  nothing is printed by the workers, and a second ``cached()`` in the same
  process builds everything cleanly.
* SIGTERM to the process: it dies, and its workers exit by themselves; the lock is free, nothing is published, and the next
  ``cached()`` builds cleanly and removes the dead build's directory.

Each with the worker forked from the script (which runs no other thread) and, with
``TSC_WORKER_START=spawn``, started as a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

import tensorstore_cache as tsc
from benchmarks.guarantees.interrupts import gone, mid_build
from tensorstore_cache import config
from tensorstore_cache.cache.namespace import Namespace
from tensorstore_cache.fs.locks import ExclusiveLock

from ..support._clients import LoggedImages, calls, environment, expected, python

GUARD_S = 120  # a guard against hangs, not a timing assertion

_BUILDER = '''
import os
import signal
import sys
import time

import numpy as np

import tensorstore_cache as tsc
from tensorstore_cache import config
from tests.support._clients import LoggedImages

# as in a terminal, even if whoever started us ignores SIGINT
signal.signal(signal.SIGINT, signal.default_int_handler)
paths = open(PATHS).read().splitlines()
print("BUILDER", os.getpid(), flush=True)
try:
    tsc.cached(paths, cache_dir=CACHE, loader=LoggedImages(LOG, delay=0.2), workers=2,
               progress=False)
except KeyboardInterrupt:
    print("INTERRUPTED", time.time(), flush=True)
else:
    sys.exit("the build was not interrupted")
sys.stdin.readline()  # the test looks at what the interrupt left, then lets us go on
store = tsc.cached(paths, cache_dir=CACHE, loader=LoggedImages(LOG + ".again"), workers=2,
                   progress=False)
np.save(OUT, store.stack(paths))
print("REBUILT", len(store), flush=True)
'''


@contextlib.contextmanager
def _builder(tmp_path: Path, paths: list[str], start: str) -> Iterator[subprocess.Popen[str]]:
    listing = tmp_path / "paths.txt"
    listing.write_text("\n".join(paths))
    (tmp_path / "build.py").write_text(
        f"PATHS, CACHE, LOG, OUT = {str(listing)!r}, {str(tmp_path / 'cache')!r}, "
        f"{str(tmp_path / 'calls.log')!r}, {str(tmp_path / 'out.npy')!r}\n" + _BUILDER
    )
    env = environment(**({config.WORKER_START_ENV: "spawn"} if start == "spawn" else {}))
    proc = subprocess.Popen([python(), "build.py"], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left of its session
        proc.communicate(timeout=GUARD_S)


def _check_start(builder: int, workers: set[int], start: str) -> None:
    """The worker was forked (it runs the script's command line) or is a fresh interpreter."""
    (worker,) = workers
    forked = psutil.Process(worker).cmdline() == psutil.Process(builder).cmdline()
    assert forked is (start == "fork"), psutil.Process(worker).cmdline()


def _wait_gone(pids: set[int]) -> None:
    start = time.monotonic()
    while not all(gone(p) for p in pids):
        assert time.monotonic() - start < GUARD_S, f"hang guard: workers still alive: {pids}"
        time.sleep(0.02)


def _namespace(tmp_path: Path) -> Namespace:
    (root,) = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    return Namespace(root)


def _assert_left_nothing(tmp_path: Path) -> None:
    ns = _namespace(tmp_path)
    lock = ExclusiveLock(ns.lock_path)
    assert lock.try_acquire() is True, "the build lock is still held"
    lock.release()
    assert ns.current() is None, "something was published"
    assert list(ns.parts_dir.iterdir()) == [], "a temporary directory was left"


@pytest.mark.parametrize("start", ["fork", "spawn"])
@pytest.mark.parametrize("target", ["process", "process-group"])
def test_sigint_mid_build(
    tmp_path: Path, client_images: list[str], target: str, start: str
) -> None:
    log = tmp_path / "calls.log"
    with _builder(tmp_path, client_images, start) as proc:
        builder, workers = mid_build(proc, log)
        assert len(workers) == 1, workers
        _check_start(builder, workers, start)
        if target == "process":
            os.kill(builder, signal.SIGINT)
        else:
            os.killpg(builder, signal.SIGINT)  # the builder and its workers
        assert proc.stdout is not None
        line = proc.stdout.readline()
        got = re.match(r"INTERRUPTED (\S+)", line)
        assert got is not None, line + proc.stdout.read() + (proc.stderr.read() if proc.stderr else "")
        # the workers were killed and reaped before KeyboardInterrupt reached the script
        assert all(gone(p) for p in workers), [p for p in workers if not gone(p)]
        left = psutil.Process(builder).children(recursive=True)  # no helper process either
        assert left == [], left
        _assert_left_nothing(tmp_path)
        assert proc.stdin is not None
        out, err = proc.communicate("go\n", timeout=GUARD_S)
    assert proc.returncode == 0, err
    assert "REBUILT 150" in out, out
    # nobody printed a KeyboardInterrupt traceback: the workers ignore SIGINT
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected(client_images))
    again = Counter(key for _pid, key in calls(str(log) + ".again"))
    assert set(again) == set(client_images) and set(again.values()) == {1}


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_sigterm_mid_build(tmp_path: Path, client_images: list[str], start: str) -> None:
    log = tmp_path / "calls.log"
    with _builder(tmp_path, client_images, start) as proc:
        builder, workers = mid_build(proc, log)
        assert len(workers) == 1, workers
        _check_start(builder, workers, start)
        os.kill(builder, signal.SIGTERM)
        assert proc.wait(GUARD_S) == -signal.SIGTERM
        _wait_gone(workers)  # within the hang guard
    ns = _namespace(tmp_path)
    lock = ExclusiveLock(ns.lock_path)
    assert lock.try_acquire() is True
    lock.release()
    assert ns.current() is None
    debris = [p.name for p in ns.parts_dir.iterdir()]
    assert len(debris) == 1 and ".tsc-build-" in debris[0]  # invisible to readers
    count = len(calls(log))
    store = tsc.cached(client_images, cache_dir=tmp_path / "cache", loader=LoggedImages(log),
                       workers=2, progress=False)
    np.testing.assert_array_equal(store.stack(client_images), expected(client_images))
    rebuilt = Counter(key for _pid, key in calls(log)[count:])
    assert set(rebuilt) == set(client_images) and set(rebuilt.values()) == {1}
    current = ns.current()
    assert current is not None
    assert [p.name for p in ns.parts_dir.iterdir() if p.is_dir()] == list(current.parts), "debris removed"
