"""Killed and failing builders: nothing partial is ever visible, nothing is left behind.

* A builder is SIGKILLed just before each of its I/O steps in turn (every
  mkdir, file creation, write, fsync and rename; ``TSC_TEST_KILL_AT``).
  Afterwards the target is either absent or a complete store that verifies
  and holds the right values (with ``overwrite=True``: the old store or the
  new one, never nothing), ``collect_debris`` removes every temporary
  directory, and a new build succeeds.
* Builders are SIGKILLed at random moments, pool workers included.
* ``ENOSPC``/``EIO`` are injected at the n-th ``write`` or ``fsync``, once or
  from then on: the build raises that ``OSError``, publishes nothing and
  leaves no temporary directory.
* A pool worker killed mid-build makes the build fail with a ``BuildError``.

Run as ``python -m tests.test_guarantees.test_crash MODE JSON`` this module is also the
driver the tests start in a subprocess.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.cache.namespace import Namespace
from tensorstore_cache.fs.locks import ExclusiveLock
from tensorstore_cache.writer.builder import collect_debris

from ..support._cache_loaders import LogLoader, expected, write_sources
from ..support._clients import in_pool_worker
from ..support._loaders import Filled

REPO = Path(__file__).resolve().parents[2]
ITEM = (3, 4, 4)
N_OLD, N_NEW = 100, 200  # the new build has 4 shards of 64, 64, 64, 8 rows with workers=1


_vec = Filled(ITEM, offset=1)
_vec_new = Filled(ITEM, offset=1, sign=-1)


def _keys(n: int) -> list[str]:
    return [f"k{i}" for i in range(n)]


def _build(root: Path, new: bool = True, **kw: Any) -> tsc.CacheStore:
    n, fn = (N_NEW, _vec_new) if new else (N_OLD, _vec)
    kw.setdefault("workers", 1)
    return tsc.build_store(_keys(n), root, loader=fn, loader_id="vec/1", progress=False, **kw, identity="none")


def _expected(new: bool) -> np.ndarray:
    n, fn = (N_NEW, _vec_new) if new else (N_OLD, _vec)
    return np.stack([fn(k) for k in _keys(n)])


def _kinds_in_code() -> set[str]:
    """Every kind of I/O step the package marks (each ``io_step("<kind>")`` call)."""
    package = REPO / "tensorstore_cache"
    return {m for f in package.rglob("*.py")
            for m in re.findall(r'io_step\("(\w+)"\)', f.read_text())}


def _debris(root: Path) -> list[str]:
    return sorted(p.name for p in root.parent.iterdir() if p.name.startswith(f".{root.name}."))


def _state(root: Path) -> str:
    """``"missing"``, ``"old"`` or ``"new"``; fails the test on anything else."""
    try:
        store = tsc.open_store(root)
    except tsc.StoreNotFoundError:
        return "missing"
    with store:
        store.verify()
        values = store.take(np.arange(len(store)))
        for name, new in (("new", True), ("old", False)):
            want = _expected(new)
            if values.shape == want.shape and np.array_equal(values, want):
                assert store.paths == _keys(len(want))
                return name
    raise AssertionError(f"{root} holds a store that is neither the old nor the new one")


def _driver(mode: str, args: dict[str, Any]) -> dict[str, Any]:
    base = Path(args["base"])
    if mode == "kill-every-step":
        from tensorstore_cache.fs import crash as _jsonio

        overwrite = bool(args["overwrite"])
        count = base / "count" / "s.tsc"
        if overwrite:
            _build(count, new=False).close()
        _jsonio._KILL_AT = -1  # count the steps only
        _jsonio._io_trace.clear()
        _build(count, overwrite=overwrite).close()
        steps = list(_jsonio._io_trace)
        _jsonio._KILL_AT = 0
        results = []
        for k in range(1, len(steps) + 2):
            root = base / f"k{k:03d}" / "s.tsc"
            if overwrite:
                _build(root, new=False).close()
            else:
                root.parent.mkdir()
            pid = os.fork()
            if pid == 0:  # the builder: dies at step k (or finishes, for the last k)
                try:
                    _jsonio._KILL_AT = k
                    _jsonio._io_trace.clear()
                    _build(root, overwrite=overwrite).close()
                    code = 0
                except BaseException:
                    traceback.print_exc()
                    code = 3
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            results.append({
                "k": k,
                "root": str(root),
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            })
        return {"steps": steps, "results": results}
    if mode == "inject":
        target_name, err, always = args["call"], args["errno"], args["always"]
        real = getattr(os, target_name)
        calls = [0]
        fail_at = [0]
        counting = threading.Lock()  # the build syncs its tree from several threads at once

        def fake(*a: Any) -> Any:
            with counting:
                calls[0] += 1
                n = calls[0]
            if fail_at[0] and (n == fail_at[0] or (always and n > fail_at[0])):
                raise OSError(err, os.strerror(err))
            return real(*a)

        setattr(os, target_name, fake)
        _build(base / "count" / "s.tsc").close()
        total = calls[0]
        results = []
        for n in range(1, total + 1):
            root = base / f"n{n:03d}" / "s.tsc"
            root.parent.mkdir()
            calls[0], fail_at[0] = 0, n
            try:
                _build(root).close()
                outcome: Any = "built"
            except OSError as exc:
                outcome = [type(exc).__name__, exc.errno, isinstance(exc, tsc.TensorStoreCacheError)]
            except BaseException as exc:
                outcome = [type(exc).__name__, None, repr(exc)]
            finally:
                fail_at[0] = 0
            results.append({"n": n, "root": str(root), "outcome": outcome,
                            "exists": root.exists(), "debris": _debris(root)})
        setattr(os, target_name, real)
        return {"total": total, "results": results}
    if mode == "build":  # one build, to be killed from outside
        print("building", flush=True)
        n = int(args["n"])
        loader = _Held(args["log"], int(args["at"])) if args.get("log") else _big
        tsc.build_store(_keys(n), Path(args["root"]), loader=loader, loader_id="big/1",
                        workers=int(args["workers"]), progress=False, overwrite=True, identity="none")
        return {"built": True}
    raise ValueError(mode)


def _run_driver(mode: str, args: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_guarantees.test_crash", mode, json.dumps(args)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


# -- SIGKILL at every I/O step ------------------------------------------------------

@pytest.fixture
def fast_tmp(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs when there is one: the same files, without the fsync cost.

    What a SIGKILL leaves on disk does not depend on the file system (the page
    cache survives the process); only power loss would, which no test here simulates.
    """
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="tsc-crash-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("overwrite", [False, True], ids=["new-target", "overwrite"])
def test_sigkill_at_every_io_step(fast_tmp: Path, overwrite: bool) -> None:
    out = _run_driver("kill-every-step", {"base": str(fast_tmp), "overwrite": overwrite})
    steps, results = out["steps"], out["results"]
    assert set(steps) == _kinds_in_code(), "a kind of I/O step the build takes was never killed"
    assert len(results) == len(steps) + 1
    rebuilt = results[:: max(1, len(results) // 12)]
    seen = []
    for res in results:
        k, root = res["k"], Path(res["root"])
        if k <= len(steps):
            assert res["signal"] == signal.SIGKILL, f"step {k} ({steps[k - 1]}): {res}"
        else:
            assert res["exit"] == 0, res
        state = _state(root)
        seen.append(state)
        if overwrite:
            assert state in ("old", "new"), f"killed before step {k}: the store vanished"
        if res not in rebuilt:  # the rebuilt ones are left to the next build to collect
            collect_debris(root)
            assert _debris(root) == [], f"killed before step {k}: debris {_debris(root)}"
    # the kill points cover both sides of the publishing rename, and it is one step
    assert seen[-1] == "new"
    flips = [i for i in range(1, len(seen)) if seen[i] != seen[i - 1]]
    assert len(flips) == 1, seen
    published_by = steps[flips[0] - 1]
    assert published_by == "rename", (flips, published_by)
    # durable before published: after the build's last write, every file it created and every
    # directory of the store are synced (together), and only then is the group metadata
    # written and synced, with its directory, and the store published by the rename, which
    # is followed by nothing but the sync of its directory
    group = len(steps) - 1 - steps[::-1].index("create")
    synced = group
    while steps[synced - 1] in ("fsync", "fsync_dir"):
        synced -= 1
    tree = steps[synced:group]
    walked = list(os.walk(results[-1]["root"]))
    files, directories = sum(len(names) for _d, _s, names in walked), len(walked)
    assert tree.count("fsync") == steps[:synced].count("create") == files - 1, tree
    assert tree.count("fsync_dir") == directories, (tree, directories)
    assert steps[group:] == ["create", "write", "fsync", "fsync_dir", "rename", "fsync_dir"]
    assert group + 4 == flips[0] - 1, (group, flips)  # that rename is the publishing one
    # and a new build over what a killed builder left succeeds and collects its debris itself
    left = 0
    for res in rebuilt:
        root = Path(res["root"])
        left += len(_debris(root))
        _build(root, overwrite=True).close()
        assert _state(root) == "new"
        assert _debris(root) == [], f"the next build left {_debris(root)}"
    assert left > 0, "no rebuilt case had debris to collect"


def test_the_environment_variable_arms_the_hook(tmp_path: Path) -> None:
    root = tmp_path / "s.tsc"
    code = (
        "import sys; from tests.test_guarantees.test_crash import _build; from pathlib import Path; "
        "_build(Path(sys.argv[1]))"
    )
    env = {**os.environ, "TSC_TEST_KILL_AT": "12"}
    proc = subprocess.run([sys.executable, "-c", code, str(root)], env=env, cwd=REPO,
                          capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not root.exists()
    assert len(_debris(root)) == 1  # the dead builder's directory, invisible to readers
    with pytest.raises(tsc.StoreNotFoundError):
        tsc.open_store(root)
    _build(root).close()  # the next build collects the dead builder's directory by itself
    assert _debris(root) == []
    assert _state(root) == "new"


# -- SIGKILL at random moments, pool workers included ------------------------------

def _big(key: str) -> np.ndarray:
    i = int(key.rsplit("k", 1)[1])
    return np.full((3, 32, 32), i % 251 + 1, dtype=np.float32)


class _Held:
    """:func:`_big`, but the item ``k<at>`` never comes: the process computing it writes
    ``held`` to ``log`` and waits there to be killed, while the build's other process goes on.
    A build killed once ``held`` is written is surely killed mid-build."""

    def __init__(self, log: str, at: int) -> None:
        self.log, self.at = log, at

    def __call__(self, key: str) -> np.ndarray:
        if key == f"k{self.at}":
            Path(self.log).write_text(f"held {os.getpid()}\n")
            time.sleep(3600)  # never returns: the test kills the build
        return _big(key)


def _pool_workers(psutil: Any, pid: int, wait: bool) -> list[Any]:
    """The builder's pool workers; with ``wait``, at least one."""
    deadline = time.monotonic() + 60  # a guard against hangs, not a timing assertion
    while True:
        children = psutil.Process(pid).children(recursive=True)
        workers = list(children)
        if workers or not wait:
            return workers
        assert time.monotonic() < deadline, "the build never started a pool worker"
        time.sleep(0.01)


def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    """A build of 3,000 items with a pool worker, SIGKILLed at a random point of its progress
    (once it reaches a random item, which then never comes: the other process goes on), and
    once with a pool worker killed first: every kill lands mid-build, so the target stays
    absent, no worker survives, the debris is collected and a new build succeeds."""
    psutil = pytest.importorskip("psutil")
    rng = random.Random(20240601)
    root = tmp_path / "s.tsc"
    n = 3000
    for round_ in range(4):
        log = tmp_path / f"held-{round_}"
        args = {"base": str(tmp_path), "root": str(root), "n": n, "workers": 2, "log": str(log),
                "at": rng.randrange(n)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.test_guarantees.test_crash", "build", json.dumps(args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "building"
            deadline = time.monotonic() + 120  # a guard against hangs, not a timing assertion
            while not log.exists():
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                assert time.monotonic() < deadline, f"the build never reached k{args['at']}"
                time.sleep(0.01)
            # the last round kills a pool worker first (as soon as there is one), then the
            # coordinator
            workers = _pool_workers(psutil, proc.pid, wait=round_ == 3)
            children = psutil.Process(proc.pid).children(recursive=True)
            if round_ == 3:
                workers[0].kill()
            proc.kill()
            _out, err = proc.communicate(timeout=30)
            # it was still building when killed (or, its pool worker killed first, it had
            # failed the build already)
            assert proc.returncode == -signal.SIGKILL or (
                round_ == 3 and proc.returncode == 1 and "BuildError" in err), err[-3000:]
            # orphaned workers notice their coordinator is gone and exit by themselves
            _, alive = psutil.wait_procs(workers, timeout=30)
            assert not alive, alive
            psutil.wait_procs(children, timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # anything left of this session
            if proc.stdout is not None:
                proc.stdout.close()
            if proc.stderr is not None:
                proc.stderr.close()
        with pytest.raises(tsc.StoreNotFoundError):
            tsc.open_store(root)  # killed before it published: nothing is visible
        assert not root.exists()
        collect_debris(root)
        assert _debris(root) == []
    store = tsc.build_store(_keys(n), root, loader=_big, loader_id="big/1", workers=2,
                            progress=False, overwrite=True, identity="none")
    store.verify()
    assert len(store) == n
    np.testing.assert_array_equal(store[f"k{n - 1}"], _big(f"k{n - 1}"))
    store.close()
    assert _debris(root) == []


# -- I/O errors -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("call", "err", "always"),
    [
        ("write", errno.ENOSPC, False),
        ("write", errno.ENOSPC, True),
        ("write", errno.EIO, False),
        ("fsync", errno.EIO, False),
        ("fsync", errno.ENOSPC, True),
    ],
    ids=["write-ENOSPC-once", "write-ENOSPC-always", "write-EIO-once", "fsync-EIO-once",
         "fsync-ENOSPC-always"],
)
def test_io_error_at_every_call_propagates_and_publishes_nothing(
    fast_tmp: Path, call: str, err: int, always: bool
) -> None:
    out = _run_driver("inject", {"base": str(fast_tmp), "call": call, "errno": err,
                                 "always": always})
    assert out["total"] >= 15  # shards, index arrays and metadata: every one is hit
    late = []
    for res in out["results"]:
        assert res["outcome"] == ["OSError", err, False], res
        assert res["debris"] == [], res
        if res["exists"]:
            late.append(res["n"])
            assert _state(Path(res["root"])) == "new"
    # Only the directory fsync after the publishing rename can fail once the store is
    # visible; the error is still raised (durability is not assured) and the store
    # is complete - the same contract as an I/O error while SQLite commits.
    if call == "fsync":
        assert late == [out["total"]]
    else:
        assert late == []
    # nothing is left to collect: a build in the same place simply works
    root = Path(out["results"][0]["root"])
    _build(root).close()
    assert _state(root) == "new"


@pytest.mark.parametrize("call", ["write", "fsync"])
def test_io_error_inside_cached_leaves_the_build_lock_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """ENOSPC at the first write (or fsync) into the build's directory, the lock held."""
    cache = tmp_path / "cache"
    keys = write_sources(tmp_path / "src", 20)
    real = getattr(os, call)
    held_at_error: list[bool] = []
    first = threading.Lock()  # the build syncs its tree from several threads at once

    def failing(fd: int, *a: Any) -> Any:
        if ".tsc-build-" in os.readlink(f"/proc/self/fd/{fd}"):
            with first:
                failed = bool(held_at_error)
                if not failed:  # the first call into the build's directory fails, once
                    (lock_path,) = cache.glob("*/lock")
                    probe = ExclusiveLock(lock_path)
                    held_at_error.append(not probe.try_acquire())
                    if not held_at_error[0]:
                        probe.release()
            if not failed:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, *a)

    monkeypatch.setattr(os, call, failing)
    with pytest.raises(OSError) as info:
        tsc.cached(keys, cache_dir=cache, loader=LogLoader(tmp_path / "log"), workers=1,
                   progress=False)
    monkeypatch.setattr(os, call, real)
    assert info.value.errno == errno.ENOSPC
    assert held_at_error == [True], "the error came while the build lock was held"
    (ns_dir,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    ns = Namespace(ns_dir)
    lock = ExclusiveLock(ns.lock_path)
    assert lock.try_acquire() is True, "the build lock was left held"
    lock.release()
    assert not [p for p in ns.parts_dir.iterdir() if ".tsc-build-" in p.name]
    store = tsc.cached(keys, cache_dir=cache, loader=LogLoader(tmp_path / "log"),
                       progress=False, lock_timeout=0)
    np.testing.assert_array_equal(store.take(store.rows(keys)), expected(keys))


def _enospc_in_worker(key: str) -> np.ndarray:
    if in_pool_worker():  # only ever inside a pool worker

        def full(fd: int, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        os.write = full
    return _vec(key)


def test_io_error_in_a_pool_worker_propagates(tmp_path: Path) -> None:
    root = tmp_path / "s.tsc"
    with pytest.raises(OSError) as info:
        tsc.build_store(_keys(N_NEW), root, loader=_enospc_in_worker, workers=2, progress=False, identity="none")
    assert info.value.errno == errno.ENOSPC
    assert not root.exists() and _debris(root) == []


# -- a pool worker dies ------------------------------------------------------------

def _dies_on_k13(key: str) -> np.ndarray:
    if key == "k13" and in_pool_worker():  # the worker's first shard is always its own
        os.kill(os.getpid(), signal.SIGKILL)
    return _vec(key)


def test_killed_pool_worker_fails_the_build_cleanly(tmp_path: Path) -> None:
    root = tmp_path / "s.tsc"
    with pytest.raises(tsc.BuildError) as info:
        tsc.build_store(_keys(N_NEW), root, loader=_dies_on_k13, workers=2, progress=False, identity="none")
    message = str(info.value)
    # the shard the worker was building, its first source, and how the worker died
    assert "building shard vectors/c/0/0/0/0 (64 sources from 'k0') died by signal 9 (SIGKILL)" \
        in message, message
    assert "nothing was published" in message and "workers=1" in message
    assert isinstance(info.value.__cause__, BrokenExecutor)
    assert not root.exists() and _debris(root) == []
    with pytest.raises(tsc.StoreNotFoundError):
        tsc.open_store(root)


if __name__ == "__main__":
    print(json.dumps(_driver(sys.argv[1], json.loads(sys.argv[2]))), flush=True)
