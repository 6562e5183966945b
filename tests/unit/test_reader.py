"""Layer 4, reader: lookups (one place), the trivial overlay, the store's interface, shards on demand."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import xxhash

import tensorstore_cache as tsc
from tensorstore_cache.errors import KeyNotInStoreError
from tensorstore_cache.format import encode_key
from tensorstore_cache.format.keys import key_layout
from tensorstore_cache.format.metadata import shard_count, shard_key
from tensorstore_cache.fs.trust import Trust
from tensorstore_cache.reader import keyindex as keyindex_module
from tensorstore_cache.reader import lookup as lookup_module
from tensorstore_cache.reader import view_of
from tensorstore_cache.reader.assembly import SegmentSource, assemble, open_directory
from tensorstore_cache.reader.keyindex import all_same, same_bytes
from tensorstore_cache.reader.overlay import Overlay
from tensorstore_cache.reader.segment import Segment
from tensorstore_cache.reader.store import CacheStore
from tensorstore_cache.reader.supply import FetchStats
from tensorstore_cache.reader.view import StoreView

from ..support._cache_loaders import LogLoader, expected, write_sources
from ..support._loaders import Filled
from ..support._stores import Layered, layered

_vec = Filled((8,))


def _build(root: Path, keys: list[str], identity: Literal["stat", "none"] = "none") -> Path:
    tsc.build_store(keys, root, loader=_vec, loader_id="vec/1", workers=1, progress=False,
                    identity=identity).close()
    return root


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000])
def test_single_and_bulk_lookups_agree_with_a_dict(tmp_path: Path, n: int) -> None:
    keys = [f"d/{i % 7}/k{i}" for i in range(n)]
    seg = Segment(_build(tmp_path / "s.tsc", keys))
    try:
        encoded = [k.encode() for k in [*keys, "absent", "d/0/k"]]
        hashes = np.array([xxhash.xxh3_64_intdigest(e) for e in encoded], np.uint64)
        want = [*range(n), -1, -1]
        assert [seg.keys.find(e, int(h)) for e, h in zip(encoded, hashes, strict=True)] == want
        assert seg.keys.find_many(encoded, hashes).tolist() == want
        # a hash that is stored with other bytes is not a hit (the bytes are compared)
        assert seg.keys.find(b"not-this", int(hashes[0])) == -1
        assert seg.keys.find_many([b"not-this"], hashes[:1]).tolist() == [-1]
        # ... nor is one of the same length, beside keys that are found
        forged = [*encoded[:n], encoded[0][:-1] + b"X"]
        forged_hashes = np.append(hashes[:n], hashes[0])
        assert seg.keys.find_many(forged, forged_hashes).tolist() == [*range(n), -1]
    finally:
        seg.close()


def test_same_bytes_compares_lengths_and_every_byte() -> None:
    stored = np.frombuffer(b"abcXYZhello", np.uint8)
    starts = np.array([0, 3, 6, 6, 0], np.uint64)
    stops = np.array([3, 6, 11, 10, 0], np.uint64)
    keys = [b"abc", b"XYz", b"hello", b"hello", b""]
    assert same_bytes(stored, starts, stops, keys).tolist() == [True, False, True, False, True]
    assert same_bytes(stored, starts[:1], stops[:1], [b"ab"]).tolist() == [False]



def test_all_same_compares_every_byte_of_keys_of_any_lengths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # keys of 5 to 20 bytes: covered by up to 4 windows of 5 bytes; one changed byte
    # anywhere (or a key stored at another place) makes the answer False
    rng = np.random.default_rng(11)
    keys = [bytes(rng.integers(97, 123, int(n), dtype=np.uint8))
            for n in rng.integers(5, 21, 300)]
    keys[0] = keys[0][:5]
    keys[1] = bytes(rng.integers(97, 123, 20, dtype=np.uint8))
    stored = np.frombuffer(b"zz" + b"".join(keys), np.uint8)
    begin = np.cumsum([2, *map(len, keys[:-1])]).astype(np.int64)
    mine = key_layout(keys)
    assert all_same(stored, begin, mine)
    monkeypatch.setattr(keyindex_module, "_COMPARE_BYTES", 64)  # many steps
    assert all_same(stored, begin, mine)
    assert all_same(stored, begin[5:9], mine.take(np.arange(5, 9)))
    for i in (0, 1, 150, 299):
        for at in range(len(keys[i])):
            changed = bytearray(keys[i])
            changed[at] ^= 1
            other = key_layout([*keys[:i], bytes(changed), *keys[i + 1 :]])
            assert not all_same(stored, begin, other)
    assert not all_same(stored, begin[:-1] + 1, mine.take(np.arange(len(keys) - 1)))
    # lengths too far apart for a few windows, or an empty key: not decided here
    assert not all_same(np.frombuffer(b"ab" + b"x" * 30, np.uint8), np.array([0, 2]),
                        key_layout([b"ab", b"x" * 30]))
    assert not all_same(stored, begin[:1], key_layout([b""]))
    assert all_same(stored, begin[:0], key_layout([]))


def test_same_bytes_in_many_steps_matches_a_comparison_key_by_key() -> None:
    # keys whose bytes span many comparison steps, differing at their first, a middle or
    # their last byte, or in length, wherever a step boundary falls
    rng = np.random.default_rng(7)
    # a few keys longer than a window, compared byte by byte
    lengths = np.where(rng.random(3000) < 0.02, rng.integers(257, 600, 3000),
                       rng.integers(1, 120, 3000))
    keys = [bytes(rng.integers(97, 123, int(n), dtype=np.uint8)) for n in lengths]
    stored_keys = list(keys)
    for i in rng.choice(len(keys), 400, replace=False).tolist():
        k = bytearray(keys[i])
        where = int(rng.integers(0, 4))
        if where == 3:
            k.append(97)
        else:
            at = (0, len(k) // 2, len(k) - 1)[where]
            k[at] = 65
        stored_keys[i] = bytes(k)
    order = rng.permutation(len(keys))  # stored in another order than asked
    blob = b"".join(stored_keys[i] for i in order)
    offsets = np.zeros(len(keys) + 1, np.uint64)
    offsets[1:] = np.cumsum([len(stored_keys[i]) for i in order])
    place = np.empty(len(keys), np.int64)
    place[order] = np.arange(len(keys))
    starts, stops = offsets[place], offsets[place + 1]
    got = same_bytes(np.frombuffer(blob, np.uint8), starts, stops, keys)
    assert len(blob) > 2 * keyindex_module._COMPARE_BYTES
    assert got.tolist() == [a == b for a, b in zip(keys, stored_keys, strict=True)]
    assert not got.all() and got.sum() == len(keys) - 400

def test_one_segment_is_the_trivial_overlay(tmp_path: Path) -> None:
    seg = Segment(_build(tmp_path / "s.tsc", [f"k{i}" for i in range(50)]))
    overlay = Overlay([seg])
    rows = np.array([5, 0, 49], np.int64)
    seg_of, local = overlay.locate(rows)
    assert seg_of.tolist() == [0, 0, 0] and local is rows
    assert overlay.locate_one(7) == (0, 7) and overlay.n == 50 and overlay.dead_rows == 0
    assert overlay.find("k9") == (0, 9) and overlay.find("k99") == (-1, -1)
    seg.close()


def test_later_segments_win_and_rows_number_live_entries(tmp_path: Path) -> None:
    store = layered(_build(tmp_path / "a.tsc", ["k1", "k2", "k3"]),
                    _build(tmp_path / "b.tsc", ["k2", "k4"]))
    old, new = view_of(store).segments
    assert len(store) == 4 and store.paths == ["k1", "k3", "k2", "k4"]
    assert store.rows(["k2", "k1", "k4"]).tolist() == [2, 0, 3]
    seg_of, local = view_of(store).locate(np.array([0, 1, 2, 3], np.int64))
    assert seg_of.tolist() == [0, 0, 1, 1] and local.tolist() == [0, 2, 0, 1]
    assert view_of(store).segments == (old, new)
    assert float(view_of(store).vector(2)[0]) == 2.0 and float(store["k3"][0]) == 3.0
    with pytest.raises(IndexError, match="row 4 is out of range"):
        view_of(store).vector(4)
    store.close()


def test_bulk_lookups_find_the_newest_entry_whatever_the_segment_sizes(tmp_path: Path) -> None:
    # the biggest segment is searched first: a key it holds in a dead row (a later, smaller
    # segment overrides it) must still come from the newest segment
    old = _build(tmp_path / "a.tsc", [f"k{i}" for i in range(40)])
    mid = _build(tmp_path / "b.tsc", [f"k{i}" for i in (*range(10, 15), 40, 41)])
    big = _build(tmp_path / "c.tsc", [f"k{i}" for i in (12, 30, *range(50, 120))])
    old_vec = Filled((8,), sign=-1)
    tsc.build_store([f"k{i}" for i in range(20, 25)], tmp_path / "d.tsc", loader=old_vec,
                    loader_id="vec/1", workers=1, progress=False, identity="none").close()
    store = layered(old, mid, big, tmp_path / "d.tsc")
    try:
        keys = [f"k{i}" for i in range(125)] * 2
        rows = store.rows(keys, missing="ignore")
        one_by_one = [store.paths.index(k) if k in store else -1 for k in keys]
        assert rows.tolist() == one_by_one
        assert [store.paths[r] for r in rows.tolist() if r >= 0] == [k for k in keys if k in store]
        # k20..k24 come from the newest (smallest) segment, whose vectors are negative
        assert all(float(view_of(store).vector(r)[0]) < 0 for r in store.rows(["k20", "k24"]).tolist())
        assert float(store["k12"][0]) == 12.0 and float(store["k3"][0]) == 3.0
    finally:
        store.close()


def test_rows_of_repeated_paths_equal_the_rows_of_each_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # absolute cover-like paths over several lookup steps, with repeats, paths that need
    # normalising and absent paths in the same step
    monkeypatch.setattr(lookup_module, "_ROWS_CHUNK", 64)
    keys = [f"/data/covers/images/{i % 13:02x}/{i % 7:02x}/{i:010d}.01.THUMBZZZ.jpg.k{i}"
            for i in range(400)]
    store = layered(_build(tmp_path / "a.tsc", keys[:300]), _build(tmp_path / "b.tsc", keys[250:]))
    try:
        rng = np.random.default_rng(3)
        asked = [keys[i] for i in rng.integers(0, len(keys), 1500).tolist()]
        asked[7] = asked[7].replace("/images/", "/images//")  # normalised to a stored key
        asked[100] = asked[100].replace("/data/", "/data/./")
        each = {k: int(store.rows([k])[0]) for k in keys}
        want = [each[k.replace("//", "/").replace("/./", "/")] for k in asked]
        assert store.rows(asked).tolist() == want
        assert store.rows(np.array(asked)).tolist() == want
        assert store.rows(asked[:60]).tolist() == want[:60]  # one step, no repeats looked for
        assert store.rows(keys).tolist() == [each[k] for k in keys]  # distinct, several steps
        assert len(store) == len(keys) and len(set(want)) > 300
        absent = [*asked[:90], "/data/covers/none.jpg", *asked[90:200], "/data/covers/none.jpg"]
        got = store.rows(absent, missing="ignore")
        assert got[90] == got[-1] == -1 and (np.delete(got, [90, len(got) - 1]) >= 0).all()
        with pytest.raises(KeyNotInStoreError, match=r"none\.jpg"):
            store.rows(absent)
    finally:
        store.close()


def test_rows_normalise_exactly_the_paths_not_found_as_given(tmp_path: Path) -> None:
    # paths are looked up as given first: the ones that are not their own key, absent
    # ones and bad ones beside found ones give what normalize_key would
    keys = ["/a/b/c.k0", "/a/b/d.k1", "rel/e.k2", "a.b/..c.k3", "//x/y.k4"]
    store = tsc.open_store(_build(tmp_path / "s.tsc", keys))
    try:
        asked: list[str | Path] = [
            "/a/b/c.k0", "/a//b/d.k1", "./rel/e.k2", "rel/e.k2/", "a.b/..c.k3",
            Path("/a/b/./c.k0"), "//x/y.k4", "/x/y.k4/", "rel/e.k2", "/a/b/z/../c.k0",
        ]
        want = [0, 1, 2, 2, 3, 0, 4, -1, 2, 0]
        assert store.rows(asked, missing="ignore").tolist() == want
        assert store.rows([str(p) for p in asked], missing="ignore").tolist() == want
        with pytest.raises(KeyNotInStoreError) as info:
            store.rows(["/a/b/c.k0", "/no//such/./f", "rel/e.k2", "no/such/g"])
        assert info.value.missing == ["/no/such/f", "no/such/g"]
        bad: Any
        for bad, error, match in (("", ValueError, "empty"), ("a\x00b", ValueError, "NUL"),
                                  (3, TypeError, "str or os.PathLike")):
            with pytest.raises(error, match=match):
                store.rows(["/a/b/c.k0", bad, "rel/e.k2"], missing="ignore")
    finally:
        store.close()


def test_source_identity_is_what_the_build_recorded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    paths = []
    for i in range(3):
        (src / f"k{i}").write_bytes(b"x" * (i + 1))
        paths.append(str(src / f"k{i}"))
    with _open(_build(tmp_path / "s.tsc", paths, identity="stat")) as store:
        ident = view_of(store).source_identity(np.array([2, 0], np.int64), content_hash=True)
        assert ident.size.tolist() == [3, 1]
        assert ident.mtime_ns.tolist() == [os.stat(paths[2]).st_mtime_ns, os.stat(paths[0]).st_mtime_ns]
        assert ident.content_hash is not None and ident.content_hash.tolist() == [0, 0]  # none recorded
        assert view_of(store).source_identity(np.array([1], np.int64)).content_hash is None


def test_stale_reads_the_recorded_identity_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    paths = []
    for i in range(3):
        (src / f"k{i}").write_bytes(b"x" * (i + 1))
        paths.append(str(src / f"k{i}"))
    asked: list[bool] = []
    recorded = StoreView.source_identity

    def counted(self: StoreView, rows: Any, *, content_hash: bool = False) -> Any:
        asked.append(content_hash)
        return recorded(self, rows, content_hash=content_hash)

    with _open(_build(tmp_path / "s.tsc", paths, identity="stat")) as store:
        monkeypatch.setattr(StoreView, "source_identity", counted)
        (src / "k1").write_bytes(b"changed")
        assert store.stale() == [paths[1]]  # each entry judged as recorded: by stat
        assert asked == [True]  # one read, the content hashes of racily clean entries with it


def _open(root: Path) -> CacheStore:
    return open_directory(root)


class CopyingSupply:
    """Puts shard files in place from another directory, as a remote transport would."""

    def __init__(self, source: Path, root: Path, spec: Any, budget: int | None = None) -> None:
        self.source, self.root, self.spec = source, root, spec
        self.budget = budget
        self.asked: list[list[int]] = []
        self.closed = False
        self.stats = FetchStats()
        self.held: dict[int, int] = {}

    def ensure(self, shards: Sequence[int]) -> None:
        self.asked.append(list(shards))
        for k in shards:
            self.held[k] = self.held.get(k, 0) + 1
            rel = shard_key(self.spec, k)
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.source / rel, self.root / rel)

    def prefetch(self, shards: Sequence[int], *, background: bool = False) -> Future[int]:
        self.ensure(shards)
        done: Future[int] = Future()
        done.set_result(len(shards))
        return done

    def release(self, k: int) -> None:
        self.held[k] -= 1
        if not self.held[k]:
            del self.held[k]

    def close(self) -> None:
        self.closed = True


def supplied(root: Path, supply: CopyingSupply) -> CacheStore:
    """Open the store directory ``root`` with its shards supplied on demand by ``supply``."""
    where = Layered((str(root),))
    return assemble(where, [SegmentSource(root=root, trust=Trust.explicit(root),
                                          supply=lambda _meta: supply)])


def test_missing_shards_are_supplied_once_per_batch(tmp_path: Path) -> None:
    keys = [f"k{i}" for i in range(300)]
    full = _build(tmp_path / "full.tsc", keys)
    sparse = tmp_path / "sparse.tsc"
    shutil.copytree(full, sparse)
    spec = Segment(full).spec
    assert shard_count(spec) >= 3
    for k in range(shard_count(spec)):
        (sparse / shard_key(spec, k)).unlink()
    supply = CopyingSupply(full, sparse, spec)
    store = supplied(sparse, supply)
    s = spec.rows_per_shard
    rows = np.array([0, 2 * s, 1, 2 * s + 1], np.int64)  # shards 0 and 2
    np.testing.assert_array_equal(store.take(rows), np.stack([_vec(keys[int(r)]) for r in rows]))
    assert supply.asked == [[0, 2]]
    store.take(rows)
    float(store[keys[s]][0])  # shard 1, on its own
    assert supply.asked == [[0, 2], [1]]
    store.close()
    assert supply.closed


@pytest.mark.parametrize("budget", [1, 2])
def test_a_budget_of_mapped_shards_releases_the_rest_and_returns_copies(
    tmp_path: Path, budget: int
) -> None:
    keys = [f"k{i}" for i in range(300)]
    full = _build(tmp_path / "full.tsc", keys)
    sparse = tmp_path / "sparse.tsc"
    shutil.copytree(full, sparse)
    spec = Segment(full).spec
    count = shard_count(spec)
    assert count >= 3
    for k in range(count):
        (sparse / shard_key(spec, k)).unlink()
    supply = CopyingSupply(full, sparse, spec, budget=budget)
    store = supplied(sparse, supply)
    reference = open_directory(full)
    every = np.arange(len(keys))
    for rows in (every, every[::-1], np.random.default_rng(0).permutation(every)):
        np.testing.assert_array_equal(store.take(rows), reference.take(rows))
        assert len(supply.held) <= budget and all(n == 1 for n in supply.held.values())
    v = store[keys[5]]
    np.testing.assert_array_equal(v, reference[keys[5]])
    assert v.base is None and v.flags.writeable  # a copy of its own, not a view of a shard
    for i in range(0, len(keys), 7):  # single rows across every shard
        np.testing.assert_array_equal(store[keys[i]], reference[keys[i]])
        assert len(supply.held) <= budget
    np.testing.assert_array_equal(v, reference[keys[5]])  # still intact after its shard went
    store.close()


def test_without_a_supply_a_missing_shard_is_a_clear_error(tmp_path: Path) -> None:
    root = _build(tmp_path / "s.tsc", ["k1", "k2"])
    spec = Segment(root).spec
    (root / shard_key(spec, 0)).unlink()
    with open_directory(root) as store, pytest.raises(tsc.CorruptStoreError, match="is missing"):
        store["k1"]


def test_open_directory_needs_a_directory(tmp_path: Path) -> None:
    with pytest.raises(tsc.StoreNotFoundError, match="no store at"):
        open_directory(tmp_path / "nothing")


def test_store_getitem_fast_path_normalises_what_it_does_not_find(tmp_path: Path) -> None:
    with open_directory(_build(tmp_path / "s.tsc", ["d/k1", "k2"])) as store:
        assert float(store["d/k1"][0]) == 1.0
        assert float(store["d//./k1"][0]) == 1.0 and float(store[Path("d/k1")][0]) == 1.0
        assert float(store["./k2"][0]) == 2.0
        with pytest.raises(tsc.KeyNotInStoreError, match="'d/k3'"):
            store["d//k3"]
        for bad, error in (("", ValueError), ("d/k1\x00", ValueError), (3, TypeError)):
            with pytest.raises(error):
                store[bad]  # type: ignore[index]


class _Holds:
    """A supply that counts the holds it gave out (a budget of 2 files)."""

    stats = FetchStats()

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    @property
    def budget(self) -> int | None:
        return 2

    def prefetch(self, shards: Sequence[int], *, background: bool = False) -> Future[int]:
        raise AssertionError("not asked for by a budget")

    def close(self) -> None:
        pass

    def ensure(self, shards: Sequence[int]) -> None:
        for k in shards:
            self.held[k] = self.held.get(k, 0) + 1

    def release(self, k: int) -> None:
        self.held[k] -= 1
        assert self.held[k] >= 0, f"file {k} given back more often than it was held"


def test_a_budget_gives_back_every_hold_a_failed_mapping_took() -> None:
    from tensorstore_cache.reader.budget import MappedBudget

    supply, mapped, broken = _Holds(), set(), {3}

    def map_file(k: int) -> None:
        if k in broken:
            raise tsc.CorruptStoreError(f"file {k} is damaged", str(k))
        mapped.add(k)

    budget = MappedBudget.of(
        supply, share=1, first=100, lock=threading.Lock(), is_mapped=mapped.__contains__,
        map_file=map_file, unmap_file=mapped.discard,
    )
    assert budget is not None and budget.limit == 2
    with pytest.raises(tsc.CorruptStoreError):
        budget.with_mapped([1, 2, 3, 4], lambda: None)
    # files 1 and 2 stay mapped, each with its one hold; 3 and 4 hold nothing
    assert mapped == {1, 2} and supply.held == {101: 1, 102: 1, 103: 0, 104: 0}
    broken.clear()
    budget.with_mapped([4], lambda: None)  # the least recently used beyond 2 given back
    assert mapped == {2, 4} and supply.held == {101: 0, 102: 1, 103: 0, 104: 1}
    mapped.add(5)  # mapped outside the budget (map_all), then read: in the order from now
    supply.ensure([105])
    budget.touch(5)
    budget.with_mapped([4], lambda: None)
    assert len(mapped) == 2 and sum(supply.held.values()) == 2
    # reads that keep failing on a damaged file map no more than the budget
    broken.add(9)
    for k in (6, 7, 8):
        with pytest.raises(tsc.CorruptStoreError):
            budget.with_mapped([k, 9], lambda: None)
        assert len(mapped) <= 2 and sum(supply.held.values()) == len(mapped)


def test_rows_of_long_paths_go_in_smaller_steps_and_agree_with_a_dict(tmp_path: Path) -> None:
    # a step's temporaries grow with its paths' bytes: long paths take fewer per step
    keys = [f"{'long-directory-name/' * 20}k{i:05d}" for i in range(1500)]
    assert lookup_module._step(keys) < lookup_module._ROWS_CHUNK
    assert lookup_module._step([f"d/k{i}" for i in range(10)]) == lookup_module._ROWS_CHUNK
    assert lookup_module._step([Path("a")] * 10) == lookup_module._ROWS_CHUNK
    with tsc.open_store(_build(tmp_path / "s.tsc", keys)) as store:
        want = {k: i for i, k in enumerate(store.paths)}
        asked = [*keys[::-1], "./" + keys[3], "absent/one"]
        rows = store.rows(asked, missing="ignore")
        assert rows.tolist() == [*(want[k] for k in keys[::-1]), want[keys[3]], -1]
        with pytest.raises(KeyNotInStoreError) as info:
            store.rows([*keys, "absent/two", "absent/three"])
        assert "absent/two" in str(info.value) and "absent/three" in str(info.value)


def test_a_part_wholly_overridden_by_two_later_parts_is_looked_up(tmp_path: Path) -> None:
    # racing builders without locks can leave a big part every row of which
    # later parts override; a batch lookup searched it first and indexed its
    # empty set of live rows (IndexError from rows())
    keys = write_sources(tmp_path / "src", 6)
    stores = []
    for i, subset in enumerate((keys, keys[:3], keys[3:])):
        for k in subset:
            Path(k).write_bytes(f"version {i} of {k}".encode())
        tsc.build_store(subset, tmp_path / f"part{i}", loader=LogLoader(tmp_path / "log"),
                        progress=False).close()
        stores.append(Segment(tmp_path / f"part{i}"))
    overlay = Overlay(stores)
    assert overlay.n == 6 and overlay.live_rows(0).size == 0
    encoded = [encode_key(k) for k in [*keys, "not/in/store"]]
    rows = overlay.find_many(encoded)
    assert rows[-1] == -1 and sorted(rows[:-1].tolist()) == list(range(6))
    assert [overlay.find(k) for k in keys] == [
        (1 if i < 3 else 2, i % 3) for i in range(6)
    ]
    out = np.empty((6, 4), np.float32)
    overlay.gather(rows[:-1], out)
    np.testing.assert_array_equal(out, expected(keys))
