"""cached() and open_store beside a running gc; source identity taken before every read.

Each race is forced at one point, deterministically: the test wraps the
library function that runs at that moment so that a real ``gc`` (another
process, run to completion) happens exactly there, then lets the call go on.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.cache.namespace import Namespace
from tensorstore_cache.fs import temp
from tensorstore_cache.fs.locks import ExclusiveLock
from tensorstore_cache.reader.segment import Segment
from tensorstore_cache.remote.fetch import fetch_store

from ..support._cache_loaders import GateLoader, LogLoader, expected, log_lines, write_sources

REPO = Path(__file__).resolve().parents[2]


def run_gc(cache: Path, **kwargs: Any) -> None:
    """Run ``tsc.gc(cache, **kwargs)`` in another process, to completion."""
    code = f"import tensorstore_cache as t; t.gc({str(cache)!r}, **{kwargs!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


def calls(log: Path) -> Counter[str]:
    return Counter(key for _pid, key in log_lines(log))


@pytest.fixture
def keys(tmp_path: Path) -> list[str]:
    return write_sources(tmp_path / "src", 201)


@pytest.fixture
def once() -> Iterator[Callable[[Callable[[], None]], Callable[[], None]]]:
    """Make an action that runs only the first time it is called."""

    def make(action: Callable[[], None]) -> Callable[[], None]:
        done: list[bool] = []

        def run() -> None:
            if not done:
                done.append(True)
                action()

        return run

    yield make


def _gated_build(cache: str, keys: list[str], log: str, gate: str, out: str) -> None:
    store = tsc.cached(keys, cache_dir=cache, loader=GateLoader(log, gate), workers=1,
                       progress=False)
    np.save(out, store.take(store.rows(keys)))


def test_gc_max_bytes_evicts_around_a_build_holding_its_lock(
    tmp_path: Path, keys: list[str]
) -> None:
    """gc(max_bytes=0) while a builder holds its namespace's lock mid-build: the other
    namespace goes, the one being built stays and its build completes; once the lock is free
    the same gc evicts it."""
    cache = tmp_path / "cache"
    log, gate, out = tmp_path / "log", tmp_path / "gate", tmp_path / "out.npy"
    extended = tsc.cached(keys[:3], cache_dir=cache, loader=LogLoader(log), progress=False)
    other = tsc.cached(keys[:3], cache_dir=cache, loader=LogLoader(log, scale=2), progress=False)
    building, idle = Path(extended.location), Path(other.location)
    extended.close()
    other.close()
    before = len(log_lines(log))
    ctx: Any = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_gated_build, args=(str(cache), keys[:6], str(log), str(gate),
                                                   str(out)))
    proc.start()
    try:
        deadline = time.monotonic() + 120  # a guard against hangs, not a timing assertion
        while len(log_lines(log)) == before:  # the builder holds the lock at its first item
            assert proc.is_alive() and time.monotonic() < deadline, "the build never began"
            time.sleep(0.01)
        removed = tsc.gc(cache, max_bytes=0, grace=0)
        assert [(r.path, r.kind) for r in removed] == [(str(idle), "namespace")]
        assert building.exists() and not idle.exists()
        gate.touch()
        proc.join(120)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
    np.testing.assert_array_equal(np.load(out), expected(keys[:6]))
    after = tsc.gc(cache, max_bytes=0, grace=0)
    assert [r.path for r in after if r.kind == "namespace"] == [str(building)]


def test_gc_between_the_look_and_the_lock_never_returns_a_short_store(
    keys: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, once: Any
) -> None:
    # the first reproduction: 200 cached paths plus a new one, and gc(older_than=0)
    # removing the namespace after the lock-free look found the new path missing
    cache, log = tmp_path / "cache", tmp_path / "log"
    loader = LogLoader(log)
    tsc.cached(keys[:200], loader=loader, cache_dir=cache, workers=1, progress=False).close()
    gc_now = once(lambda: run_gc(cache, older_than=0))
    acquire = ExclusiveLock.acquire

    def gc_then_acquire(self: ExclusiveLock, **kw: Any) -> bool:
        gc_now()
        return acquire(self, **kw)

    monkeypatch.setattr(ExclusiveLock, "acquire", gc_then_acquire)
    store = tsc.cached(keys, loader=loader, cache_dir=cache, workers=1, progress=False)
    assert bool(np.all(store.rows(keys, missing="ignore") >= 0))
    np.testing.assert_array_equal(store.stack(keys), expected(keys))
    # gc really removed what the look had seen: every key was computed again, once
    assert calls(log) == Counter({k: 2 for k in keys[:200]} | {keys[200]: 1})


def _cached_close(cache: str, keys: list[str], log: str) -> None:
    tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), workers=1, progress=False).close()


def test_a_namespace_made_again_while_the_lock_is_opened_is_the_one_built(
    keys: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, once: Any
) -> None:
    """The lock opens the namespace's directories, then its lock file. Between the two, gc
    removes the namespace and another caller makes it again: the lock taken is the new
    namespace's, and the directories this call reads must be the new ones too (the soak once
    found a caller whose own new part 'no longer existed': it looked in the removed one)."""
    cache, log = tmp_path / "cache", tmp_path / "log"
    _cached_close(str(cache), keys[:100], str(log))

    (namespace,) = [p for p in cache.iterdir() if not p.name.startswith(".")]

    def gc_and_remake() -> None:
        run_gc(cache, max_bytes=0, grace=0)
        assert not namespace.exists(), "gc did not remove the namespace"
        ctx: Any = multiprocessing.get_context("spawn")
        other = ctx.Process(target=_cached_close, args=(str(cache), keys[150:151], str(log)))
        other.start()
        other.join(120)  # a guard against hangs, not a timing assertion
        if other.is_alive():
            other.kill()
        assert other.exitcode == 0
        assert namespace.exists(), "the other caller did not make the namespace again"

    interfere = once(gc_and_remake)
    acquiring: list[bool] = []
    acquire, ensure = ExclusiveLock.acquire, Namespace.ensure

    def flagged_acquire(self: ExclusiveLock, **kw: Any) -> bool:
        acquiring.append(True)
        return acquire(self, **kw)

    def ensure_then_interfere(self: Namespace) -> None:
        ensure(self)
        if acquiring:  # the lock's own preparation, just before it opens the lock file
            interfere()

    monkeypatch.setattr(ExclusiveLock, "acquire", flagged_acquire)
    monkeypatch.setattr(Namespace, "ensure", ensure_then_interfere)
    wanted = keys[100:120]
    store = tsc.cached(wanted, loader=LogLoader(log), cache_dir=cache, workers=1, progress=False)
    assert acquiring, "the call never took the lock"
    np.testing.assert_array_equal(store.stack(wanted), expected(wanted))
    # the namespace made again holds the other caller's key and this call's, each computed once
    assert set(store.paths) >= {*wanted, keys[150]}
    assert calls(log) == Counter({k: 1 for k in keys[:120]} | {keys[150]: 1})


def test_gc_while_the_look_maps_parts_is_not_corruption(
    keys: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, once: Any
) -> None:
    # gc removes the namespace after the look opened its parts, before it mapped their shards:
    # the look's CorruptStoreError (a shard file missing) must not reach the caller
    cache, log = tmp_path / "cache", tmp_path / "log"
    loader = LogLoader(log)
    tsc.cached(keys[:200], loader=loader, cache_dir=cache, workers=1, progress=False).close()
    gc_now = once(lambda: run_gc(cache, older_than=0))
    map_all = Segment.map_all

    def gc_then_map(self: Segment) -> None:
        gc_now()
        map_all(self)

    monkeypatch.setattr(Segment, "map_all", gc_then_map)
    store = tsc.cached(keys[:200], loader=loader, cache_dir=cache, workers=1, progress=False)
    np.testing.assert_array_equal(store.stack(keys[:200]), expected(keys[:200]))
    assert calls(log) == Counter({k: 2 for k in keys[:200]})


def test_open_store_of_a_namespace_gc_removes_meanwhile_says_not_found(
    keys: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, once: Any
) -> None:
    cache = tmp_path / "cache"
    store = tsc.cached(keys, loader=LogLoader(tmp_path / "log"), cache_dir=cache, workers=1,
                       progress=False)
    namespace = Path(store.location)
    store.close()
    gc_now = once(lambda: run_gc(cache, older_than=0))
    map_all = Segment.map_all

    def gc_then_map(self: Segment) -> None:
        gc_now()
        map_all(self)

    monkeypatch.setattr(Segment, "map_all", gc_then_map)
    with pytest.raises(tsc.StoreNotFoundError, match=r"holds nothing|does not exist|no cache"):
        tsc.open_store(namespace)


def test_a_source_rewritten_after_the_probe_read_it_is_stale_next_time(tmp_path: Path) -> None:
    # the second reproduction: the builder's shape probe reads paths[0], which another
    # process rewrites right after; the entry must record the stat taken before that read
    paths = []
    for i in range(6):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(bytes([i]) * 12)
        paths.append(str(p))
    code = f"""
import os, sys, time, numpy as np, tensorstore_cache as tsc
paths = {paths!r}
def loader(p):
    v = np.frombuffer(open(p, "rb").read()[:12], np.uint8).astype(np.float32)
    if p == paths[0] and not os.path.exists(p + ".done"):    # another process rewrites it
        open(p + ".done", "w").close(); time.sleep(0.02)     # right after it was read
        open(p + ".new", "wb").write(b"\\xff" * 12); os.replace(p + ".new", p)
    return v
c = sys.argv[1]
tsc.cached(paths, loader=loader, loader_id="probe/1", cache_dir=c, workers=1,
           progress=False).close()
s = tsc.cached(paths, loader=loader, loader_id="probe/1", cache_dir=c, workers=1, progress=False)
print(s[paths[0]][:4].tolist(), s.stale())
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], check=True,
                         capture_output=True, text=True, cwd=REPO, timeout=120).stdout
    assert out.split("\n")[0] == "[255.0, 255.0, 255.0, 255.0] []"


def test_every_item_records_the_stat_taken_before_its_read(tmp_path: Path) -> None:
    # the same rewrite, of an item of a pool worker's shard (not the probe)
    paths = write_sources(tmp_path / "src", 300)
    victim = paths[250]
    code = f"""
import os, sys, numpy as np, tensorstore_cache as tsc
victim = {victim!r}
def loader(p):
    data = open(p, "rb").read()
    if p == victim and not os.path.exists(p + ".done"):
        open(p + ".done", "w").close()
        open(p + ".new", "wb").write(b"\\xee" * 40); os.replace(p + ".new", p)
    return np.array([len(data), data[0]], np.float32)
c = sys.argv[1]
tsc.cached({paths!r}, loader=loader, loader_id="rewrite/1", cache_dir=c, workers=2,
           progress=False).close()
s = tsc.cached({paths!r}, loader=loader, loader_id="rewrite/1", cache_dir=c, workers=2,
               progress=False)
print(s[victim].tolist())
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], check=True,
                         capture_output=True, text=True, cwd=REPO, timeout=120).stdout
    assert out.strip() == "[40.0, 238.0]"


def test_a_racily_clean_rewrite_is_found_by_content(tmp_path: Path) -> None:
    # rewritten in the same timestamp tick at the same size: size and mtime are unchanged
    # (forced here by putting the mtime back), so only the content tells
    cache, log = tmp_path / "cache", tmp_path / "log"
    keys = write_sources(tmp_path / "src", 5)
    loader = LogLoader(log)
    first = tsc.cached(keys, loader=loader, cache_dir=cache, workers=1, progress=False)
    np.testing.assert_array_equal(first.stack(keys), expected(keys))
    # just written: a second call on unchanged sources computes nothing
    tsc.cached(keys, loader=loader, cache_dir=cache, workers=1, progress=False).close()
    assert calls(log) == Counter(keys)
    st = os.stat(keys[2])
    data = Path(keys[2]).read_bytes()
    Path(keys[2]).write_bytes(bytes(255 - b for b in data))
    os.utime(keys[2], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(keys[2]).st_size, os.stat(keys[2]).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert first.stale() == [keys[2]]
    again = tsc.cached(keys, loader=loader, cache_dir=cache, workers=1, progress=False)
    np.testing.assert_array_equal(again.stack(keys), expected(keys))
    assert calls(log) == Counter(keys) + Counter([keys[2]])


def test_sources_modified_long_ago_get_no_content_hash(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    keys = write_sources(tmp_path / "src", 5)
    for k in keys:
        os.utime(k, (1_600_000_000, 1_600_000_000))
    store = tsc.cached(keys, loader=LogLoader(tmp_path / "log"), cache_dir=cache, workers=1,
                       progress=False)
    assert not list(Path(store.location).glob("parts/*.source_xxh3"))
    recent = write_sources(tmp_path / "src", 2, start=10)
    store = tsc.cached(keys + recent, loader=LogLoader(tmp_path / "log"), cache_dir=cache,
                       workers=1, progress=False)
    (side,) = Path(store.location).glob("parts/*.source_xxh3")
    hashes = np.frombuffer(side.read_bytes(), "<u8")
    assert len(hashes) == 2 and bool(np.all(hashes != 0))


def test_gc_says_it_could_not_delete_only_what_it_could_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # an entry created inside a namespace while gc removes it (a process holding a
    # descriptor of its directory) is removed by a further pass, not reported as refused
    cache = tmp_path / "cache"
    keys = write_sources(tmp_path / "src", 4)
    namespace = Path(tsc.cached(keys, loader=LogLoader(tmp_path / "log"), cache_dir=cache,
                                workers=1, progress=False).location)
    rmdir = os.rmdir
    created: list[str] = []

    def rmdir_while_written(path: Any, *args: Any, **kw: Any) -> None:
        if not created and ".tsc-gc-" in str(path) and kw.get("dir_fd") is None:
            # the writer's file lands after rmtree listed the directory, before its rmdir
            Path(path, "last_used").touch()
            created.append(str(path))
        rmdir(path, *args, **kw)

    monkeypatch.setattr(os, "rmdir", rmdir_while_written)
    with caplog.at_level(logging.WARNING, logger="tensorstore_cache"):
        removed = tsc.gc(cache, older_than=0)
    assert created, "the concurrent write happened"
    assert [r.kind for r in removed] == ["namespace"] and not namespace.exists()
    assert not any(p.name.startswith(".") for p in cache.iterdir()), "nothing left aside"
    assert "could not delete" not in caplog.text


def test_delete_tree_names_what_kept_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doomed = tmp_path / "d"
    (doomed / "sub").mkdir(parents=True)
    (doomed / "sub" / "f").write_bytes(b"x")
    unlink = os.unlink

    def refuse(path: Any, *args: Any, **kw: Any) -> None:
        if str(path).endswith("f"):
            raise PermissionError(13, "Permission denied", str(path))
        unlink(path, *args, **kw)

    monkeypatch.setattr(os, "unlink", refuse)
    error = temp.delete_tree(doomed)
    assert isinstance(error, PermissionError)
    monkeypatch.setattr(os, "unlink", unlink)
    leftover = [p for p in tmp_path.iterdir()]
    aside = temp.parse_temp(leftover[0].name)
    assert len(leftover) == 1 and aside is not None
    assert (aside.target, aside.kind, aside.pid) == ("d", "gc", os.getpid())
    assert temp.delete_tree(leftover[0]) is None and not leftover[0].exists()


def test_open_store_through_the_node_cache_beside_gc_refetches_evicted_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, once: Any
) -> None:
    # gc(max_bytes=1) evicts the version between its download and this process's hold on it
    keys = write_sources(tmp_path / "src", 50)
    built = tsc.build_store(keys, tmp_path / "local.tsc", loader=LogLoader(tmp_path / "log"),
                            workers=1, progress=False)
    cache = tmp_path / "node"
    gc_now = once(lambda: run_gc(cache, max_bytes=1))
    fetched: list[Path] = []

    def fetch_then_gc(*args: Any, **kw: Any) -> Any:
        local = fetch_store(*args, **kw)
        fetched.append(local)
        gc_now()
        return local

    monkeypatch.setattr("tensorstore_cache.remote.copy.fetch_store", fetch_then_gc)
    with tsc.open_store(built.location, local_copy="always", cache_dir=cache) as copy:
        np.testing.assert_array_equal(copy.stack(keys), expected(keys))
    # the first download was evicted before it was held, and fetched again
    assert len(fetched) == 2 and fetched[0] == fetched[1]


_READER = """
import sys, numpy as np, tensorstore_cache as tsc
src, cache, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ref = tsc.open_store(src, local_copy="never")
rng = np.random.default_rng(0)
reads = 0
for i in range(n):
    with tsc.open_store(src, local_copy="always", cache_dir=cache, max_bytes=1 << 20) as s:
        rows = rng.integers(0, len(ref), 64)
        assert np.array_equal(s.take(rows), ref.take(rows))
        one = int(rows[0])
        assert np.array_equal(s[ref.paths[one]], ref.take([one])[0])
        reads += 65
print("READS", reads)
"""

_GC_LOOP = """
import sys, time, tensorstore_cache as tsc
cache, seconds = sys.argv[1], float(sys.argv[2])
end = time.time() + seconds
runs = 0
while time.time() < end:
    tsc.gc(cache, max_bytes=1, grace=0)
    runs += 1
print("GC", runs)
"""


def test_capped_reads_beside_a_gc_loop_never_raise(tmp_path: Path) -> None:
    # readers of a capped node copy (small shards, many evictions) and gc(max_bytes=1) in a
    # loop, all real processes: every read is right, nothing raises
    keys = write_sources(tmp_path / "src", 3000)
    src = tsc.build_store(keys, tmp_path / "local.tsc", loader=LogLoader(tmp_path / "log"),
                          workers=1, progress=False, shard_bytes=4096).location
    cache = tmp_path / "node"
    gc = subprocess.Popen([sys.executable, "-c", _GC_LOOP, str(cache), "20"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    readers = [
        subprocess.Popen([sys.executable, "-c", _READER, src, str(cache), "40"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        for r in readers:
            out, err = r.communicate(timeout=240)
            assert r.returncode == 0, err[-3000:]
            assert "READS 2600" in out
        out, err = gc.communicate(timeout=120)
        assert gc.returncode == 0, err[-3000:]
        assert int(out.split()[1]) > 0
    finally:
        for p in [gc, *readers]:
            if p.poll() is None:
                p.kill()
                p.wait()
