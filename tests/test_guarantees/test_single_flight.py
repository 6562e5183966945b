"""Racing processes on one cache: every item computed once, dead builders replaced.

Real processes (spawn and fork) released together by a barrier; a loader that
logs every call with O_APPEND shows how often each item was computed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.cache.namespace import Namespace
from tensorstore_cache.fs.locks import ExclusiveLock
from tensorstore_cache.reader import view_of

from ..support._cache_loaders import LogLoader, MeetingLoader, expected, log_lines, write_sources

JOIN_S = 120  # a guard against hangs, not a timing assertion


def _racer(cache: str, keys: list[str], log: str, barrier: Any, out: str, locks: str,
           meet: int) -> None:
    if locks == "broken":
        # The test-only switch: this process takes no file lock at all (what the build lock
        # prevents is then seen), never a setting of the library.
        from tensorstore_cache.fs import locks as lock_module

        lock_module.locks_enabled = lambda: False
    elif locks:
        os.environ["TSC_CACHE_LOCKS"] = locks
    loader = MeetingLoader(log, meet) if meet else LogLoader(log)
    barrier.wait()
    store = tsc.cached(keys, cache_dir=cache, loader=loader, workers=1, progress=False)
    np.save(out, store.take(store.rows(keys)))


def _race(tmp_path: Path, method: str, subsets: list[list[str]], locks: str = "",
          meet: int = 0) -> list[np.ndarray]:
    ctx: Any = multiprocessing.get_context(method)
    barrier = ctx.Barrier(len(subsets))
    procs = [
        ctx.Process(
            target=_racer,
            args=(str(tmp_path / "cache"), keys, str(tmp_path / "log"), barrier,
                  str(tmp_path / f"out{i}.npy"), locks, meet),
        )
        for i, keys in enumerate(subsets)
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(JOIN_S)
            assert p.exitcode == 0, f"racer exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return [np.load(tmp_path / f"out{i}.npy") for i in range(len(subsets))]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_eight_racers_compute_every_item_once(tmp_path: Path, method: str) -> None:
    keys = write_sources(tmp_path / "src", 40)
    results = _race(tmp_path, method, [keys] * 8)
    calls = Counter(key for _pid, key in log_lines(tmp_path / "log"))
    assert set(calls) == set(keys)
    assert set(calls.values()) == {1}, "an item was computed more than once"
    assert len({pid for pid, _key in log_lines(tmp_path / "log")}) == 1, "one builder"
    want = expected(keys)
    for got in results:
        np.testing.assert_array_equal(got, want)
    store = tsc.cached(keys, cache_dir=tmp_path / "cache", loader=LogLoader(tmp_path / "log"),
                       progress=False)
    assert len(store) == len(keys) and len(view_of(store).segments) == 1


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_without_the_build_lock_racers_compute_items_twice(tmp_path: Path, method: str) -> None:
    """The race of the test above, its lock switched off in the racers: work is duplicated.

    The racers' loader waits until two of them are loading, so the overlap the lock forbids
    happens every time; with the lock, that wait ends at its hang guard with one builder.
    """
    keys = write_sources(tmp_path / "src", 40)
    results = _race(tmp_path, method, [keys] * 8, locks="broken", meet=2)
    calls = Counter(key for _pid, key in log_lines(tmp_path / "log"))
    assert set(calls) == set(keys)
    assert max(calls.values()) > 1, "no item was computed twice without the lock"
    assert len({pid for pid, _key in log_lines(tmp_path / "log")}) > 1
    want = expected(keys)
    for got in results:
        np.testing.assert_array_equal(got, want)


def test_overlapping_requests_compute_each_item_once(tmp_path: Path) -> None:
    keys = write_sources(tmp_path / "src", 60)
    subsets = [keys[0:30], keys[15:45], keys[30:60], keys[::2]]
    results = _race(tmp_path, "spawn", subsets)
    calls = Counter(key for _pid, key in log_lines(tmp_path / "log"))
    assert set(calls) == set(keys) and set(calls.values()) == {1}
    for subset, got in zip(subsets, results, strict=True):
        np.testing.assert_array_equal(got, expected(subset))
    with tsc.open_store(Namespace_dir(tmp_path)) as store:
        assert sorted(store.paths) == sorted(keys) and store.spec.n == len(keys)


def Namespace_dir(tmp_path: Path) -> Path:  # noqa: N802 - reads as a noun
    (ns,) = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    return ns


def test_racers_without_locks_agree(tmp_path: Path) -> None:
    """Where flock does not work, the first manifest wins and the others adopt or extend it."""
    keys = write_sources(tmp_path / "src", 30)
    subsets = [keys, keys, keys[:20], keys[10:]]
    results = _race(tmp_path, "spawn", subsets, locks="0")
    for subset, got in zip(subsets, results, strict=True):
        np.testing.assert_array_equal(got, expected(subset))
    ns = Namespace(Namespace_dir(tmp_path))
    gens = ns.generations()
    assert gens == list(range(1, len(gens) + 1)), "generations are consecutive, none overwritten"
    with tsc.open_store(ns.root) as store:
        assert sorted(store.paths) == sorted(keys) and len(store) == len(keys)
        np.testing.assert_array_equal(store.take(store.rows(keys)), expected(keys))


def _slow_builder(cache: str, keys: list[str], log: str, err: str, delay: float) -> None:
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    store = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log, delay=delay), workers=1,
                       progress=True)
    np.save(err + ".npy", store.take(store.rows(keys)))


def _wait_for(what: str, cond: Any, timeout: float = JOIN_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_killed_builder_is_replaced_by_a_waiter(tmp_path: Path) -> None:
    keys = write_sources(tmp_path / "src", 24)
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    cache = str(tmp_path / "cache")
    # the first builder hangs in its first item (same transform: the delay is no parameter)
    a = ctx.Process(target=_slow_builder, args=(cache, keys, str(log), str(tmp_path / "a.err"), 600))
    b = ctx.Process(target=_slow_builder, args=(cache, keys, str(log), str(tmp_path / "b.err"), 0))
    try:
        a.start()
        _wait_for("the first builder to start computing", lambda: len(log_lines(log)) >= 1)
        b.start()
        b_err = tmp_path / "b.err"
        _wait_for("the second caller to report whom it waits for",
                  lambda: b_err.exists() and "waiting for" in b_err.read_text())
        assert f"pid {a.pid} on host" in b_err.read_text()
        parts = Namespace(Namespace_dir(tmp_path)).parts_dir
        assert any(".tsc-build-" in p.name for p in parts.iterdir()), "a build in progress"
        assert a.pid is not None
        os.kill(a.pid, signal.SIGKILL)  # mid-build, holding the lock
        a.join(JOIN_S)
        b.join(JOIN_S)
        assert a.exitcode == -signal.SIGKILL
        assert b.exitcode == 0
    finally:
        for p in (a, b):
            if p.is_alive():
                p.kill()
    np.testing.assert_array_equal(np.load(str(b_err) + ".npy"), expected(keys))
    lines = log_lines(log)
    by_b = Counter(key for pid, key in lines if pid == b.pid)
    assert set(by_b) == set(keys) and set(by_b.values()) == {1}
    assert [key for pid, key in lines if pid != b.pid] == [keys[0]], "the killed builder began"
    # the dead builder's temporary directory was invisible to readers; the waiter removed it
    ns = Namespace(Namespace_dir(tmp_path))
    assert not any(".tsc-build-" in p.name for p in ns.parts_dir.iterdir())
    assert tsc.gc(cache) == []
    with tsc.open_store(ns.root) as store:
        assert len(store) == len(keys)


def test_lock_timeout_names_the_holder(tmp_path: Path) -> None:
    keys = write_sources(tmp_path / "src", 3)
    loader = LogLoader(tmp_path / "log")
    tsc.cached(keys[:1], cache_dir=tmp_path / "cache", loader=loader, progress=False)
    ns = Namespace(Namespace_dir(tmp_path))
    holder = ExclusiveLock(ns.lock_path)
    assert holder.try_acquire() is True
    try:
        with pytest.raises(tsc.StoreLockedError) as info:
            tsc.cached(keys, cache_dir=tmp_path / "cache", loader=loader, progress=False,
                       lock_timeout=0.3)
        assert f"pid {os.getpid()}" in str(info.value)
        assert isinstance(info.value, TimeoutError)
        # what is cached already needs no lock
        store = tsc.cached(keys[:1], cache_dir=tmp_path / "cache", loader=loader,
                           progress=False, lock_timeout=0.3)
        assert len(store) == 1
    finally:
        holder.release()
    assert len(tsc.cached(keys, cache_dir=tmp_path / "cache", loader=loader, progress=False)) == 3
