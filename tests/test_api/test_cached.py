"""cached(): namespaces, incremental parts, staleness, compaction, list_caches and gc."""

from __future__ import annotations

import os
import pickle
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.cache.compact import MAX_PARTS, merge_start
from tensorstore_cache.cache.namespace import Namespace
from tensorstore_cache.fs.locks import ExclusiveLock
from tensorstore_cache.reader import view_of

from ..conftest import gc_under_reader, write_images
from ..support._cache_loaders import LogLoader, expected, log_lines, vector_of, write_sources

JOIN_S = 120


def calls(log: Path) -> Counter[str]:
    return Counter(key for _pid, key in log_lines(log))


def namespaces(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith("."))


def live_parts(store: tsc.CacheStore) -> int:
    return len(view_of(store).segments)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


# -- get or build ------------------------------------------------------------------


def test_images_built_once_then_opened(images: list[str], cache: Path) -> None:
    store = tsc.cached(images, cache_dir=cache, workers=1, progress=False)
    ref = tsc.ImageLoader(size=(32, 32))
    assert len(store) == len(images) and store.spec.n == len(images)
    np.testing.assert_array_equal(store[images[3]], ref(images[3]))
    (ns,) = namespaces(cache)
    built = list((ns / "parts").iterdir())
    again = tsc.cached(images[::-1] + images[:5], cache_dir=cache, workers=1, progress=False)
    assert list((ns / "parts").iterdir()) == built, "nothing new was built"
    np.testing.assert_array_equal(again.take(again.rows(images)), store.take(store.rows(images)))
    # the namespace opens with open_store, and a store pickles to the same view
    with tsc.open_store(ns) as opened:
        assert sorted(opened.paths) == sorted(store.paths)
    clone = pickle.loads(pickle.dumps(again))
    np.testing.assert_array_equal(clone.take(clone.rows(images)), again.take(again.rows(images)))


def test_default_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = write_sources(tmp_path / "src", 3)
    monkeypatch.setenv("TSC_CACHE_DIR", str(tmp_path / "envcache"))
    store = tsc.cached(keys, loader=LogLoader(tmp_path / "log"), progress=False)
    assert store.location.startswith(str(tmp_path / "envcache"))


def test_each_transform_has_its_own_namespace(tmp_path: Path, cache: Path) -> None:
    images = write_images(tmp_path / "img", 6)
    a = tsc.cached(images, cache_dir=cache, size=(32, 32), workers=1, progress=False)
    b = tsc.cached(images, cache_dir=cache, size=(16, 16), workers=1, progress=False)
    c = tsc.cached(images, cache_dir=cache, size=(32, 32), dtype="uint8", workers=1, progress=False)
    assert a[images[0]].shape == (3, 32, 32) and b[images[0]].shape == (3, 16, 16)
    assert c[images[0]].dtype == np.uint8
    keys = write_sources(tmp_path / "src", 4)
    log = tmp_path / "log"
    d = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log, scale=1), progress=False)
    e = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log, scale=2), progress=False)
    f = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), loader_id="tests.other/1",
                   progress=False)
    np.testing.assert_array_equal(e.take(e.rows(keys)), 2 * d.take(d.rows(keys)))
    assert len({s.location for s in (a, b, c, d, e, f)}) == 6
    assert len(namespaces(cache)) == 6
    assert calls(log) == Counter({k: 3 for k in keys})


def _plain_loader(path: str) -> np.ndarray:
    return vector_of(Path(path).read_bytes())


def test_custom_loader_without_an_id_is_named_by_what_it_computes(
    tmp_path: Path, cache: Path
) -> None:
    keys = write_sources(tmp_path / "src", 2)
    store = tsc.cached(keys, cache_dir=cache, loader=_plain_loader, workers=1, progress=False)
    np.testing.assert_array_equal(store.take(store.rows(keys)), expected(keys))
    assert [c.loader_id for c in tsc.list_caches(cache)] == [
        tsc.loader_fingerprint(_plain_loader).loader_id]
    store = tsc.cached(keys, cache_dir=cache, loader=_plain_loader, loader_id="tests.plain/1",
                       workers=1, progress=False)
    np.testing.assert_array_equal(store.take(store.rows(keys)), expected(keys))
    assert len(namespaces(cache)) == 2  # an explicit id wins
    with pytest.raises(ValueError, match="loader_id"):
        tsc.cached(keys, cache_dir=cache, loader_id="x/1", progress=False)
    bad = LogLoader(tmp_path / "log")
    bad.scale = object()  # type: ignore[assignment]
    with pytest.raises(TypeError, match="JSON"):
        tsc.cached(keys, cache_dir=cache, loader=bad, progress=False)


class _Resized(LogLoader):
    item_shape = (5,)

    def __call__(self, key: str) -> np.ndarray:
        return np.zeros(5, np.float32)


class _ResizedUndeclared(_Resized):
    item_shape = None  # type: ignore[assignment]


def test_changed_output_shape_without_new_id_is_refused(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 3)
    log = tmp_path / "log"
    tsc.cached(keys[:2], cache_dir=cache, loader=LogLoader(log), progress=False)
    with pytest.raises(ValueError, match="new loader_id"):
        tsc.cached(keys, cache_dir=cache, loader=_Resized(log), progress=False)
    with pytest.raises(tsc.BuildError) as info:
        tsc.cached(keys, cache_dir=cache, loader=_ResizedUndeclared(log), progress=False)
    assert "new loader_id" in "\n".join(getattr(info.value, "__notes__", []))
    store = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), progress=False)
    np.testing.assert_array_equal(store.take(store.rows(keys)), expected(keys))


def test_empty_request(tmp_path: Path, cache: Path) -> None:
    store = tsc.cached([], cache_dir=cache, progress=False)
    assert len(store) == 0 and store.paths == [] and store.spec.item_shape == (3, 32, 32)
    assert store.take(store.rows([])).shape == (0, 3, 32, 32)
    (ns,) = namespaces(cache)
    with pytest.raises(tsc.StoreNotFoundError, match="holds nothing yet"):
        tsc.open_store(ns)


# -- incremental parts ---------------------------------------------------------------


def test_new_paths_are_computed_alone_into_a_new_part(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 30)
    log = tmp_path / "log"
    first = tsc.cached(keys[:20], cache_dir=cache, loader=LogLoader(log), progress=False)
    second = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), progress=False)
    assert calls(log) == Counter(keys), "each item computed once, only the new ones the 2nd time"
    assert live_parts(first) == 1 and live_parts(second) == 2
    assert len(second) == 30 and second.spec.n == 30 and sorted(second.paths) == sorted(keys)
    np.testing.assert_array_equal(second.take(second.rows(keys)), expected(keys))
    # the handle opened before is untouched: same entries, same rows, same vectors
    assert len(first) == 20 and keys[25] not in first
    np.testing.assert_array_equal(first.take(first.rows(keys[:20])), expected(keys[:20]))


def test_multi_part_rows_paths_and_lookups_agree(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 24)
    log = tmp_path / "log"
    for lo, hi in ((0, 10), (5, 18), (12, 24)):
        tsc.cached(keys[lo:hi], cache_dir=cache, loader=LogLoader(log), progress=False)
    Path(keys[7]).write_bytes(b"changed content")  # overridden by a newer part
    store = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), progress=False)
    assert live_parts(store) == 4
    assert len(store) == 24 == store.spec.n == len(store.paths) == len(set(store.paths))
    np.testing.assert_array_equal(store.rows(store.paths), np.arange(24))
    batch = store.take(np.arange(24))
    for i, key in enumerate(store.paths):
        np.testing.assert_array_equal(batch[i], store[key])
        np.testing.assert_array_equal(store[key], vector_of(Path(key).read_bytes()))
    assert store.shape == (24, 4)
    assert store.get("nope") is None and "nope" not in store


def test_namespace_collected_while_opening_is_rebuilt(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = write_sources(tmp_path / "src", 5)
    log = tmp_path / "log"
    tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), progress=False)
    real = Namespace.open_parts
    state = {"first": True}

    def collected_first(*args: Any, **kwargs: Any) -> tsc.CacheStore:
        if state.pop("first", False):
            assert [r.kind for r in tsc.gc(cache, older_than=0)] == ["namespace"]
        return real(*args, **kwargs)

    monkeypatch.setattr(Namespace, "open_parts", collected_first)
    store = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), progress=False)
    np.testing.assert_array_equal(store.take(store.rows(keys)), expected(keys))
    assert calls(log) == Counter({k: 2 for k in keys})


# -- staleness --------------------------------------------------------------------------


def test_changed_source_is_recomputed_and_overrides(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 10)
    log = tmp_path / "log"
    old = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), progress=False)
    assert old.stale() == []
    was = expected(keys[4:5])[0]
    Path(keys[4]).write_bytes(b"a new version of this file")
    assert old.stale() == [keys[4]]
    assert old.stale([keys[4], keys[5], "not/in/store"]) == [keys[4]]
    new = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), progress=False)
    assert calls(log)[keys[4]] == 2 and sum(calls(log).values()) == 11
    np.testing.assert_array_equal(new[keys[4]], vector_of(b"a new version of this file"))
    assert new.stale() == [] and len(new) == 10 and new.paths.count(keys[4]) == 1
    # the handle opened before still sees what it saw
    np.testing.assert_array_equal(old[keys[4]], was)
    assert not np.array_equal(was, new[keys[4]])


def test_stale_policies_and_deleted_sources(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 6)
    log = tmp_path / "log"
    loader = LogLoader(log)
    before = tsc.cached(keys, cache_dir=cache, loader=loader, progress=False)[keys[2]].copy()
    os.unlink(keys[2])
    Path(keys[3]).write_bytes(b"edited")
    with pytest.raises(tsc.StaleSourceError) as info:
        tsc.cached(keys, cache_dir=cache, loader=loader, progress=False, on_stale="raise")
    assert info.value.stale == [keys[2], keys[3]]
    assert isinstance(info.value, ValueError) and pickle.loads(pickle.dumps(info.value)).stale
    kept = tsc.cached(keys, cache_dir=cache, loader=loader, progress=False, on_stale="ignore")
    np.testing.assert_array_equal(kept[keys[2]], before)
    assert sorted(kept.stale()) == sorted([keys[2], keys[3]])
    assert sum(calls(log).values()) == 6, "nothing recomputed"
    with pytest.raises(tsc.BuildError) as failed:
        tsc.cached(keys, cache_dir=cache, loader=loader, progress=False)
    assert [p for p, _ in failed.value.failures] == [keys[2]]
    store = tsc.cached([k for k in keys if k != keys[2]], cache_dir=cache, loader=loader,
                       progress=False)
    np.testing.assert_array_equal(store[keys[3]], vector_of(b"edited"))


def test_hash_check_ignores_touch_and_catches_hidden_edits(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 5)
    log = tmp_path / "log"
    loader = LogLoader(log)
    tsc.cached(keys, cache_dir=cache, loader=loader, progress=False, identity="content")
    st = os.stat(keys[0])
    os.utime(keys[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, same bytes
    store = tsc.cached(keys, cache_dir=cache, loader=loader, progress=False, identity="content")
    assert sum(calls(log).values()) == 5, "a touched file is not recomputed under identity='content'"
    assert store.stale(identity="stat") == [keys[0]] and store.stale(identity="content") == []
    # same size, same mtime, other bytes: only the hash sees it
    st = os.stat(keys[1])
    data = bytearray(Path(keys[1]).read_bytes())
    data[0] ^= 0xFF
    Path(keys[1]).write_bytes(bytes(data))
    os.utime(keys[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert tsc.cached(keys, cache_dir=cache, loader=loader, progress=False).stale() == []
    store = tsc.cached(keys, cache_dir=cache, loader=loader, progress=False, identity="content")
    assert calls(log)[keys[1]] == 2
    np.testing.assert_array_equal(store[keys[1]], vector_of(bytes(data)))
    with pytest.raises(ValueError, match="identity"):
        tsc.cached(keys, cache_dir=cache, loader=loader, progress=False, identity="mtime")  # type: ignore[arg-type]


def test_stat_many_threaded_path_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorstore_cache.fs import sources as _stale

    keys = write_sources(tmp_path / "src", 30)
    many = [keys[i % 30] if i % 7 else str(tmp_path / f"gone{i}") for i in range(5000)]
    pools: list[int] = []  # thread pools stat_many started: proves which path ran
    from concurrent.futures import ThreadPoolExecutor

    class CountingPool(ThreadPoolExecutor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pools.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_stale, "ThreadPoolExecutor", CountingPool)
    # the path is chosen by how long the first block's stats took: set, not timed (a loaded
    # machine's local stats once looked slow enough for threads)
    monkeypatch.setattr(_stale, "_SLOW_STAT_S", float("inf"))  # as on a local disk
    serial = _stale.stat_many(many)
    assert pools == []
    monkeypatch.setattr(_stale, "_SLOW_STAT_S", 0.0)  # as on a network filesystem
    threaded = _stale.stat_many(many)
    assert pools == [1]
    for a, b in zip(serial, threaded, strict=True):
        np.testing.assert_array_equal(a, b)
    sizes, mtimes = serial
    assert sizes[0] == -1 and mtimes[0] == -1  # a missing source
    st = os.stat(keys[8])
    assert sizes[8] == st.st_size and mtimes[8] == st.st_mtime_ns


def test_skipped_sources_are_retried(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 4)
    missing = str(tmp_path / "src" / "later.bin")
    loader = LogLoader(tmp_path / "log")
    store = tsc.cached([*keys, missing], cache_dir=cache, loader=loader, on_error="skip",
                       progress=False)
    assert len(store) == 4 and missing not in store
    assert [p for p, _ in store.spec.skipped] == [missing]
    Path(missing).write_bytes(b"here now")
    store = tsc.cached([*keys, missing], cache_dir=cache, loader=loader, progress=False)
    assert len(store) == 5 and store.spec.skipped == ()
    np.testing.assert_array_equal(store[missing], vector_of(b"here now"))


# -- compaction -----------------------------------------------------------------------


def test_merge_policy() -> None:
    assert merge_start([100] * MAX_PARTS, 0) is None
    assert merge_start([1000, *([1] * MAX_PARTS)], 0) == 1  # the increments after the big part
    assert merge_start([1] * (MAX_PARTS + 1), 0) == 1  # ties: keep the oldest
    assert merge_start([*([1] * MAX_PARTS), 1000], 0) == 0  # nothing follows the big part
    assert merge_start([100, 10], 30) == 0  # over a quarter of the rows are dead
    assert merge_start([100, 10], 20) is None


def test_many_increments_are_merged(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 60)
    log = tmp_path / "log"
    loader = LogLoader(log)
    tsc.cached(keys[:30], cache_dir=cache, loader=loader, progress=False)
    Path(keys[0]).write_bytes(b"changed after it was cached")
    first_gen: list[Any] = []
    for i in range(10):
        store = tsc.cached(keys[: 33 + 3 * i], cache_dir=cache, loader=loader, progress=False,
                           on_stale="ignore")
        if i == 0:
            first_gen.append(store)
        assert live_parts(store) <= MAX_PARTS
    assert calls(log) == Counter(keys), "merging copies vectors, it never recomputes them"
    assert len(store) == 60 and sorted(store.paths) == sorted(keys)
    np.testing.assert_array_equal(store.take(store.rows(keys[1:])), expected(keys[1:]))
    assert store.stale() == [keys[0]], "merged entries keep the identity they were computed from"
    ns = Namespace(Path(store.location))
    on_disk = [p for p in ns.parts_dir.iterdir() if p.is_dir()]
    assert len(on_disk) > live_parts(store), "replaced parts stay until gc"
    # a handle on an old generation still reads; gc keeps the parts it maps
    old = first_gen[0]
    removed = tsc.gc(cache, grace=0)
    np.testing.assert_array_equal(old.take(old.rows(keys[1:33])), expected(keys[1:33]))
    held = {str(seg.root) for seg in view_of(old).segments}
    assert held and not held & {r.path for r in removed}
    assert all(Path(p).exists() for p in held)
    old.close()
    store.close()
    removed = tsc.gc(cache, grace=0)
    assert {r.kind for r in removed} >= {"part"}
    assert sorted(p.name for p in ns.parts_dir.iterdir() if p.is_dir()) == sorted(
        ns.current().parts  # type: ignore[union-attr]
    )
    again = tsc.cached(keys, cache_dir=cache, loader=loader, progress=False, on_stale="ignore")
    np.testing.assert_array_equal(again.take(again.rows(keys[1:])), expected(keys[1:]))


def test_many_stale_entries_trigger_a_full_merge(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 20)
    loader = LogLoader(tmp_path / "log")
    tsc.cached(keys, cache_dir=cache, loader=loader, progress=False)
    for k in keys[:8]:
        Path(k).write_bytes(b"v2 " + k.encode())
    store = tsc.cached(keys, cache_dir=cache, loader=loader, progress=False)
    assert live_parts(store) == 1 and len(store) == 20
    assert view_of(store).segments[0].n == 20, "the overridden rows are gone from the merged part"
    np.testing.assert_array_equal(store.take(store.rows(keys)), expected(keys))
    assert store.stale() == []


# -- housekeeping ---------------------------------------------------------------------


def _age(ns: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(ns / "last_used", (t, t))
    os.utime(ns / "namespace.json", (t, t))


def test_list_caches(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 12)
    loader = LogLoader(tmp_path / "log")
    tsc.cached(keys[:8], cache_dir=cache, loader=loader, progress=False)
    tsc.cached(keys, cache_dir=cache, loader=loader, progress=False)
    images = write_images(tmp_path / "img", 3)
    tsc.cached(images, cache_dir=cache, size=(8, 8), workers=1, progress=False)
    infos = tsc.list_caches(cache)
    assert len(infos) == 2
    mine = next(i for i in infos if i.loader_id == LogLoader.loader_id)
    assert (mine.entries, mine.parts, mine.generation) == (12, 2, 2)
    assert mine.params == {"scale": 1} and mine.dtype == "float32" and mine.item_shape == (4,)
    assert mine.bytes > 12 * 16 and mine.building is None
    assert abs(mine.last_used.timestamp() - time.time()) < 3600
    img = next(i for i in infos if i.loader_id == "tensorstore_cache.image/1")
    assert img.item_shape == (3, 8, 8) and img.params["size"] == [8, 8]
    holder = ExclusiveLock(Path(mine.path) / "lock")
    holder.try_acquire()
    try:
        again = {i.namespace: i for i in tsc.list_caches(cache)}
        assert f"pid {os.getpid()}" in (again[mine.namespace].building or "")
    finally:
        holder.release()
    assert tsc.list_caches(tmp_path / "nothing-here") == []


def test_gc_by_age_and_size_spares_locked_namespaces(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 6)
    log = tmp_path / "log"
    stores = [
        tsc.cached(keys, cache_dir=cache, loader=LogLoader(log, scale=s), progress=False)
        for s in (1, 2, 3)
    ]
    a, b, c = (Path(s.location) for s in stores)
    for s in stores:
        s.close()
    _age(a, 10 * 86400)
    _age(b, 5 * 86400)
    _age(c, 60)
    with pytest.raises(ValueError):
        tsc.gc(cache, older_than=-1)
    preview = tsc.gc(cache, older_than=timedelta(days=1), dry_run=True)
    assert {r.path for r in preview} == {str(a), str(b)} and a.exists() and b.exists()
    lock = ExclusiveLock(b / "lock")
    assert lock.try_acquire()
    try:
        removed = tsc.gc(cache, older_than=timedelta(days=1))
    finally:
        lock.release()
    assert [(r.path, r.kind) for r in removed] == [(str(a), "namespace")]
    assert removed[0].bytes > 0 and "unused for" in removed[0].reason
    assert not a.exists() and b.exists() and c.exists()
    size_c = sum(f.stat().st_size for f in c.rglob("*") if f.is_file())
    removed = tsc.gc(cache, max_bytes=size_c + 100)
    assert [r.path for r in removed] == [str(b)], "least recently used first"
    assert c.exists()
    assert [r.path for r in tsc.gc(cache, max_bytes=0)] == [str(c)]
    assert namespaces(cache) == []
    # a collected cache is simply rebuilt
    store = tsc.cached(keys, cache_dir=cache, loader=LogLoader(log), progress=False)
    np.testing.assert_array_equal(store.take(store.rows(keys)), expected(keys))


def _reader(cache: str, keys: list[str], ready: Any, go: Any, out: str) -> None:
    store = tsc.cached(keys, cache_dir=cache, loader=LogLoader(out + ".log"), progress=False)
    first = store.take(store.rows(keys))
    ready.set()
    go.wait(JOIN_S)
    # everything below runs after gc deleted every file of this cache
    again = np.stack([store[k] for k in keys])
    np.save(out, np.stack([first, again]))


def test_reader_survives_gc_of_its_files(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 200)
    tsc.cached(keys, cache_dir=cache, loader=LogLoader(tmp_path / "log"), workers=2,
               progress=False)
    out = str(tmp_path / "reader.npy")
    gc_under_reader(_reader, cache, keys, out, JOIN_S)
    first, again = np.load(out)
    np.testing.assert_array_equal(first, expected(keys))
    np.testing.assert_array_equal(again, expected(keys))


def test_gc_removes_debris_and_orphans_but_not_fresh_ones(tmp_path: Path, cache: Path) -> None:
    keys = write_sources(tmp_path / "src", 4)
    store = tsc.cached(keys, cache_dir=cache, loader=LogLoader(tmp_path / "log"), progress=False)
    ns = Namespace(Path(store.location))
    store.close()
    dead = ns.parts_dir / ".0000aaaa-bbbbcccc.tsc-build-otherhost-123-abcd1234"
    dead.mkdir()
    (dead / "junk").write_bytes(b"x" * 100)
    orphan = ns.parts_dir / "0000aaaa-deadbeef"
    orphan.mkdir()
    (orphan / "zarr.json").write_text("{}")
    assert tsc.gc(cache) == [], "too young: a builder on another host may still be at work"
    old = time.time() - 7200
    for p in (dead, orphan):
        os.utime(p, (old, old))
    man = ns.current()
    assert man is not None
    os.utime(man.path, (old, old))
    removed = {r.path: r.kind for r in tsc.gc(cache)}
    assert removed == {str(dead): "debris", str(orphan): "part"}
    assert not dead.exists() and not orphan.exists()
    with tsc.open_store(ns.root) as again:
        np.testing.assert_array_equal(again.take(again.rows(keys)), expected(keys))


def _one_token(keys: list[str]) -> np.ndarray:
    return np.ones(len(keys), np.uint64)


def test_a_cache_whose_identity_kind_changes_recomputes_once_then_settles(tmp_path: Path) -> None:
    src = write_sources(tmp_path / "src", 40)
    log = tmp_path / "calls.log"
    kw: dict[str, Any] = {"loader": LogLoader(log), "cache_dir": tmp_path / "cache",
                          "workers": 1, "progress": False}
    tsc.cached(src[:20], identity="none", **kw).close()
    tsc.cached(src, identity="none", **kw).close()  # a second part
    assert sum(calls(log).values()) == 40
    for _ in range(4):  # merges happen along the way: parts recomputed under tokens only count
        with tsc.cached(src, identity=_one_token, **kw) as store:
            assert store.stale(identity=_one_token) == []
            np.testing.assert_array_equal(store.take(store.rows(src)), expected(src))
    assert sum(calls(log).values()) == 80, calls(log)  # each key once under the new kind
    with tsc.cached(src, **kw) as store:  # back to stat: the token rows are stale once
        assert store.stale() == []
    assert sum(calls(log).values()) == 120
