"""A build's workers forked from the building process where that is safe, fresh elsewhere.

Real scripts (``python build.py``) build 150 covers with ``workers=3``, so that a pool of two
workers computes beside the building process. The loader logs each call with its process
and whether that process holds what the script defined before the build (a global of its
``__main__``), which only a forked worker inherits:

* a script that runs no other thread forks its workers, with a progress bar too (its
  thread starts after the pool): they hold it, and they are gone when the build returns;
* a script whose thread still runs (as a notebook kernel's, or a metrics thread), that
  holds a file open, or run with ``TSC_WORKER_START=spawn``, starts fresh interpreters,
  which do not;
* a script that used torch's threads before the build forks its workers, and they compute
  torch (on one thread: torch's OpenMP pool is not theirs, and waiting for it would hang);
* either way the store has the same vectors, each computed once; the script's buffered
  output is printed once and its exit handlers run once (the forked workers neither
  flush the copies they hold nor run them);
* a forked worker does not run the script's own signal handlers: SIGTERM kills it, as it
  kills a fresh one, and the build fails naming the signal;
* a loader that asks for the cache it fills fails at once, key by key, in forked workers as
  in fresh ones;
* the pool's executor itself (``Workers``), run by a script: forked workers run the script's
  command line and fresh ones do not, and either way tasks run in them, a task's error comes
  back, a killed worker breaks the executor and no worker outlives it;
* ``TSC_WORKER_START`` set to anything else fails the build with a message naming it.

The interrupts (Ctrl-C, SIGTERM) of forked and fresh workers are in ``test_interrupts.py``.
Here too, in this process: what rules a fork out (threads, CUDA, the variable, open files
and sockets but lock files, a GNU OpenMP runtime but torch's), and
:class:`~tensorstore_cache.writer.forked.Forked`, the forked worker's process handle, on a
real child.
"""

from __future__ import annotations

import fcntl
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from tensorstore_cache import config
from tensorstore_cache.writer import forked
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
        if TORCH:  # a product of two matrices, on torch's threads here
            import torch

            torch.ones(300, 300) @ torch.ones(300, 300)
        if TERM and os.getpid() == BUILDER and not os.path.exists(TERMED):
            open(TERMED, "w").close()  # once: one worker gets SIGTERM from outside
            os.kill(min({pid for pid, _ in calls(MARKS)} - {BUILDER}), signal.SIGTERM)
        return super().__call__(path)


atexit.register(lambda: log_call(EXITS, "exit handler"))
if TERM:  # this script's own SIGTERM handler, which its workers must not run
    signal.signal(signal.SIGTERM, lambda *_: log_call(EXITS, "SIGTERM handler"))
if OPEN:  # a file open in this process, which a forked worker would share
    held = open(PATHS)
if TORCH:  # torch's OpenMP threads started here before the build
    import torch

    torch.set_num_threads(2)
    torch.ones(1000, 1000) @ torch.ones(1000, 1000)
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


def _build(tmp_path: Path, paths: list[str], env: dict[str, str] | None = None,
           **flags: bool) -> subprocess.CompletedProcess[str]:
    """Run the script; ``flags`` (``thread``, ``wait``, ``progress``, ``term``, ``open``,
    ``torch``) as it reads them, each false but ``wait`` unless given."""
    listing = tmp_path / "paths.txt"
    listing.write_text("\n".join(paths))
    names = {name: str(tmp_path / f) for name, f in [
        ("PATHS", "paths.txt"), ("CACHE", "cache"), ("LOG", "calls.log"), ("MARKS", "marks.log"),
        ("EXITS", "exits.log"), ("OUT", "out.npy"), ("PID", "builder.pid"),
        ("TERMED", "termed")]}
    given = {"thread": False, "wait": True, "progress": False, "term": False, "open": False,
             "torch": False, **flags}
    header = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    header += "".join(f"{k.upper()} = {v!r}\n" for k, v in given.items())
    (tmp_path / "build.py").write_text(header + _SCRIPT)
    # unbuffered output would hide a worker writing the script's buffer again
    env = {"PYTHONUNBUFFERED": "", config.WORKER_START_ENV: "auto", **(env or {})}
    return subprocess.run([python(), "build.py"], cwd=tmp_path, env=environment(**env),
                          capture_output=True, text=True, timeout=GUARD_S, check=False)


def _marks(tmp_path: Path) -> tuple[set[str], list[set[str]]]:
    """What the building process's and each worker's calls saw: ``{"True"}`` where the
    script's global was there (forked), ``{"False"}`` where not (fresh)."""
    builder = int((tmp_path / "builder.pid").read_text())
    marks: dict[int, set[str]] = {}
    for pid, marked in calls(tmp_path / "marks.log"):
        marks.setdefault(pid, set()).add(marked)
    return marks.pop(builder, set()), list(marks.values())


@pytest.mark.parametrize("how", ["no thread", "no thread, a progress bar", "a thread runs",
                                 "a file is open", "TSC_WORKER_START=spawn"])
def test_workers_fork_only_from_a_process_that_shares_nothing_with_them(
    tmp_path: Path, client_images: list[str], how: str
) -> None:
    env = {config.WORKER_START_ENV: "spawn"} if "spawn" in how else {}
    done = _build(tmp_path, client_images, env=env, thread=how == "a thread runs",
                  progress="progress" in how, open=how == "a file is open")
    assert done.returncode == 0, done.stderr
    builder, workers = _marks(tmp_path)
    assert len(workers) == 2, workers  # the building process and both workers computed
    forked = how.startswith("no thread")  # the bar's thread starts after the pool
    assert builder == {"True"}
    assert all(w == {str(forked)} for w in workers), workers
    # the same vectors, each computed once; no worker left; output and exit handlers once
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected(client_images))
    assert sorted(key for _pid, key in calls(tmp_path / "calls.log")) == sorted(client_images)
    assert done.stdout.split() == ["BUFFERED", "CHILDREN", "0"], done.stdout
    assert [key for _pid, key in calls(tmp_path / "exits.log")] == ["exit handler"]
    assert "Traceback" not in done.stderr, done.stderr


def test_forked_workers_compute_with_torch_after_the_builder_used_its_threads(
    tmp_path: Path, client_images: list[str]
) -> None:
    pytest.importorskip("torch")
    # torch's OpenMP pool runs here before the fork: a forked worker that used it would wait
    # forever for threads it does not have; it computes on one thread instead
    done = _build(tmp_path, client_images, torch=True)
    assert done.returncode == 0, done.stderr
    builder, workers = _marks(tmp_path)
    assert builder == {"True"} and workers == [{"True"}, {"True"}], workers
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected(client_images))


def test_a_forked_worker_does_not_run_the_callers_signal_handlers(
    tmp_path: Path, client_images: list[str]
) -> None:
    done = _build(tmp_path, client_images, term=True)  # SIGTERM to a worker mid-build
    assert done.returncode == 1
    assert "died by signal 15 (SIGTERM)" in done.stderr, done.stderr
    assert [key for _pid, key in calls(tmp_path / "exits.log")] == ["exit handler"]
    builder, workers = _marks(tmp_path)
    assert builder == {"True"} and {"True"} in workers, workers  # it was forked


def test_an_unknown_worker_start_fails_the_build_naming_it(
    tmp_path: Path, client_images: list[str]
) -> None:
    done = _build(tmp_path, client_images, wait=False,
                  env={config.WORKER_START_ENV: "forkserver"})
    assert done.returncode == 1
    assert "ValueError: $TSC_WORKER_START must be 'auto' or 'spawn', got 'forkserver'" in (
        done.stderr), done.stderr
    assert "CHILDREN" not in done.stdout  # the build failed before a pool started


_REENTRANT = '''
import os
import time

import tensorstore_cache as tsc
from tests.support._clients import AsksForItsOwnCache, calls, log_call

DEFINED_BEFORE_THE_BUILD = True
BUILDER = os.getpid()


class Logged(AsksForItsOwnCache):
    """Logs each call with whether its process holds this script's global (forked); the
    building process waits, at its first call, until both workers called (none is left out)."""

    def __call__(self, path):
        import __main__

        log_call(LOG, path)
        log_call(MARKS, str(hasattr(__main__, "DEFINED_BEFORE_THE_BUILD")))
        deadline = time.monotonic() + 60
        while os.getpid() == BUILDER and time.monotonic() < deadline:
            if len({pid for pid, _ in calls(LOG)} - {BUILDER}) >= 2:
                break
            time.sleep(0.01)
        return super().__call__(path)


try:
    tsc.cached(open(PATHS).read().splitlines(), cache_dir=CACHE, loader=Logged(CACHE),
               workers=3, progress=False)
except tsc.BuildError as exc:
    for _path, reason in exc.failures:
        print(reason.splitlines()[0])
'''


@pytest.mark.parametrize("start", ["auto", "spawn"])
def test_a_loader_asking_for_its_own_cache_fails_at_once_in_forked_and_fresh_workers(
    tmp_path: Path, client_images: list[str], start: str
) -> None:
    # a forked worker holds the builder's knowledge that this process builds the cache, a
    # fresh one learns it from its environment: each key fails at once, none builds again
    (tmp_path / "paths.txt").write_text("\n".join(client_images))
    header = "".join(f"{k} = {str(tmp_path / f)!r}\n" for k, f in [
        ("PATHS", "paths.txt"), ("CACHE", "cache"), ("LOG", "calls.log"), ("MARKS", "marks.log")])
    (tmp_path / "build.py").write_text(header + _REENTRANT)
    done = subprocess.run([python(), "build.py"], cwd=tmp_path, timeout=GUARD_S, check=False,
                          env=environment(**{config.WORKER_START_ENV: start}),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    reasons = done.stdout.splitlines()
    assert len(reasons) == len(client_images), done.stdout[-2000:]
    assert all(r.startswith("ReentrantBuildError: ") for r in reasons), reasons[:3]
    log = calls(tmp_path / "calls.log")
    assert sorted(key for _pid, key in log) == sorted(client_images)  # each key once
    assert len({pid for pid, _key in log}) == 3  # the building process and both workers
    marks: dict[int, set[str]] = {}
    for pid, marked in calls(tmp_path / "marks.log"):
        marks.setdefault(pid, set()).add(marked)
    forked = start == "auto"  # a forked worker holds the script's global, a fresh one not
    assert sorted(map(sorted, marks.values())) == sorted(
        [["True"], [str(forked)], [str(forked)]]), marks
    (ns,) = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    assert not any(".tsc-build-" in p.name for p in (ns / "parts").iterdir())


_EXECUTOR = '''
import json
import os
import signal
import time

import psutil

from tensorstore_cache.writer.procs import WorkerDied, Workers

workers = Workers(2, dict(os.environ), fork=FORK)
workers.start(os.getpid, ())  # any initializer pickled by reference
pids = [w.pid for w in workers.workers]
seen = {workers.submit(os.getpid).result(60) for _ in range(40)}
error = workers.submit(int, "x").exception(60)
me = psutil.Process()
same_command = [psutil.Process(pid).cmdline() == me.cmdline() for pid in pids]
assert all(psutil.Process(pid).ppid() == os.getpid() for pid in pids)
os.kill(pids[0], signal.SIGKILL)
broken, deadline = None, time.monotonic() + 30
while broken is None and time.monotonic() < deadline:  # the other worker may take tasks
    try:  # until the executor sees the death
        workers.submit(os.getpid).result(60)
    except WorkerDied as exc:
        broken = str(exc)
    time.sleep(0.01)
workers.shutdown()
print(json.dumps({"seen": sorted(seen), "pids": sorted(pids), "me": os.getpid(),
                  "error": repr(error), "same_command": same_command, "broken": broken,
                  "left": len(me.children(recursive=True))}))
'''


@pytest.mark.parametrize("fork", [True, False])
def test_the_executor_forks_its_workers_or_starts_fresh_ones_and_runs_tasks_alike(
    tmp_path: Path, fork: bool
) -> None:
    import json

    (tmp_path / "run.py").write_text(f"FORK = {fork!r}\n" + _EXECUTOR)
    done = subprocess.run([python(), "run.py"], cwd=tmp_path, timeout=GUARD_S, check=False,
                          env=environment(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert set(got["seen"]) <= set(got["pids"]) and got["me"] not in got["pids"]
    assert got["seen"], got  # tasks ran in the workers, not here
    # a forked worker runs this very command line; a fresh one is a new interpreter
    assert got["same_command"] == [fork, fork], got
    assert got["error"].startswith("ValueError(") and "invalid literal" in got["error"], got
    assert got["broken"] is not None and "died" in got["broken"], got  # SIGKILL breaks it
    assert got["left"] == 0, got  # no worker outlives the executor


def test_fork_allowed_follows_the_threads_cuda_files_openmp_and_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(config.WORKER_START_ENV, raising=False)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(forked, "shared_files", list)
    monkeypatch.setattr(forked, "foreign_openmp", list)
    linux = sys.platform == "linux"
    assert fork_allowed() is linux
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # another thread runs
    assert fork_allowed() is False
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    for value, allowed in [("spawn", False), (" Spawn ", False), ("auto", True), ("", True)]:
        monkeypatch.setenv(config.WORKER_START_ENV, value)
        assert fork_allowed() is (allowed and linux), value
    monkeypatch.setenv(config.WORKER_START_ENV, "fork")
    with pytest.raises(ValueError, match=r"\$TSC_WORKER_START must be 'auto' or 'spawn'"):
        fork_allowed()
    monkeypatch.delenv(config.WORKER_START_ENV)
    for initialized in (True, False):  # a torch that has initialized CUDA, or not
        fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda i=initialized: i))
        monkeypatch.setitem(sys.modules, "torch", fake)
        assert fork_allowed() is (not initialized and linux)
    monkeypatch.setattr(forked, "shared_files", lambda: ["/data/train.zip"])
    assert fork_allowed() is False
    monkeypatch.setattr(forked, "shared_files", list)
    monkeypatch.setattr(forked, "foreign_openmp", lambda: ["/usr/lib/libgomp.so.1"])
    assert fork_allowed() is False


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self")
def test_shared_files_are_open_files_and_sockets_but_lock_files_and_socket_pairs(tmp_path: Path) -> None:
    data, lock = tmp_path / "data.bin", tmp_path / "build.lock"
    data.write_bytes(b"x")
    pair = socket.socketpair()  # a multiprocessing connection is one: not shared data
    with open(data, "rb") as held, open(lock, "wb") as locking, socket.socket() as sock:
        fcntl.flock(locking.fileno(), fcntl.LOCK_EX)
        shared = forked.shared_files()
        assert str(data) in shared
        assert str(lock) not in shared  # a lock file: its lock stays the caller's
        sockets = [name for name in shared if name.startswith("socket:")]
        assert sockets == [os.readlink(f"/proc/self/fd/{sock.fileno()}")], shared
        held.close()
        assert str(data) not in forked.shared_files()
        pair[0].fileno()  # still open, never listed
    for end in pair:
        end.close()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self")
def test_foreign_openmp_names_every_libgomp_but_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = types.SimpleNamespace(__file__="/env/site-packages/torch/__init__.py")
    monkeypatch.setitem(sys.modules, "torch", torch)
    maps = [
        "7f00-7f01 r-xp 00000000 fe:00 1 /env/site-packages/torch/lib/libgomp.so.1\n",
        "7f02-7f03 r-xp 00000000 fe:00 2 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0\n",
        "7f04-7f05 r-xp 00000000 fe:00 3 /usr/lib/x86_64-linux-gnu/libc.so.6\n",
    ]
    real_open = open

    def fake_open(path: object, *args: object, **kwargs: object) -> object:
        if path == "/proc/self/maps":
            return io.StringIO("".join(maps))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", fake_open)
    assert forked.foreign_openmp() == ["/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0"]
    maps.pop(1)
    assert forked.foreign_openmp() == []


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
