"""Readers' holds on shards: byte-range OFD locks on one file per store version."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Any

from tensorstore_cache.fs.ranges import FETCH, VERSION, RangeHolds, try_lock_range, unlock_range


def _probe(path: Path, start: int, length: int = 1) -> bool | None:
    """What an evictor sees: can it lock these bytes exclusively (another description)?"""
    fd = os.open(path, os.O_RDWR)
    try:
        got = try_lock_range(fd, start, length)
        if got:
            unlock_range(fd, start, length)
        return got
    finally:
        os.close(fd)


def test_holds_conflict_with_an_evictor_in_the_same_process(tmp_path: Path) -> None:
    h = RangeHolds(tmp_path / "v.holds")
    h.hold(3)
    h.hold(3)
    assert _probe(h.path, 3) is False and _probe(h.path, 4) is True
    h.release(3)
    assert _probe(h.path, 3) is False  # still one hold
    h.release(3)
    assert _probe(h.path, 3) is True
    assert _probe(h.path, 0, 0) is False  # the whole file: the version is open
    h.close()
    assert _probe(h.path, 0, 0) is True


def _child_holds(path: str, k: int, ready: Any) -> None:
    h = RangeHolds(Path(path))
    h.hold(k)
    ready.set()
    time.sleep(60)  # until killed (the test never lets it get this far)


def test_a_killed_holder_releases_everything(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_child_holds, args=(str(tmp_path / "v.holds"), 7, ready))
    p.start()
    try:
        assert ready.wait(30) and p.pid is not None
        assert _probe(tmp_path / "v.holds", 7) is False
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
        assert _probe(tmp_path / "v.holds", 7) is True
        assert _probe(tmp_path / "v.holds", 0, 0) is True
    finally:
        p.kill()
        p.join()


def test_a_forked_child_has_holds_of_its_own(tmp_path: Path) -> None:
    h = RangeHolds(tmp_path / "v.holds")
    h.hold(5)
    h.hold(7)
    to_child, from_parent = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the inherited holds are re-taken on a description of its own
        code = 0
        try:
            os.write(to_parent, b"a")
            assert os.read(to_child, 1) == b"b"  # the parent released 5
            h.release(7)  # must not release the parent's hold on 7
            h.release(5)
            os.write(to_parent, b"c")
        except BaseException:
            code = 1
        os._exit(code)
    try:
        assert os.read(from_child, 1) == b"a"
        h.release(5)
        assert _probe(h.path, 5) is False  # the child still holds it
        os.write(from_parent, b"b")
        assert os.read(from_child, 1) == b"c"
        assert _probe(h.path, 5) is True  # now nobody does
        assert _probe(h.path, 7) is False  # the child's release did not touch the parent's
    finally:
        _, status = os.waitpid(pid, 0)
        for fd in (to_child, from_parent, from_child, to_parent):
            os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


def test_fetch_lock_excludes_other_descriptors(tmp_path: Path) -> None:
    h = RangeHolds(tmp_path / "v.holds")
    with h.fetching(2):
        assert _probe(h.path, FETCH + 2) is False
        assert _probe(h.path, FETCH + 3) is True
    assert _probe(h.path, FETCH + 2) is True
    assert VERSION > FETCH


def test_ten_thousand_holds_use_one_descriptor(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    h = RangeHolds(tmp_path / "v.holds")
    for k in range(10_000):
        h.hold(k)
    assert len(os.listdir("/proc/self/fd")) == before + 1
    assert _probe(h.path, 9_999) is False and _probe(h.path, 10_000) is True
    h.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_holds_are_empty_where_locks_are_off(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("TSC_CACHE_LOCKS", "0")
    h = RangeHolds(tmp_path / "v.holds")
    h.hold(1)
    assert not h.enabled and h.held == frozenset({1})  # counted, but no OS lock, no file
    assert not h.path.exists()
