"""Stores of records: named fixed, ragged and text fields per key (format 2)."""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.reader import view_of

from ..support._cache_loaders import log_lines
from ..support._records import (
    BOX_FIELDS,
    FIELDS,
    RecordLoader,
    expected,
    number,
    same,
    write_sources,
)

JOIN_S = 120


@pytest.fixture
def paths(tmp_path: Path) -> list[str]:
    return write_sources(tmp_path / "src", 200)


@pytest.fixture
def store(paths: list[str], tmp_path: Path) -> tsc.CacheStore:
    return tsc.build_store(paths, tmp_path / "r.tsc", loader=RecordLoader(boxes=True),
                           loader_id="records/1", fields=BOX_FIELDS, workers=1, progress=False)


def calls(log: Path) -> Counter[str]:
    return Counter(key for _pid, key in log_lines(log))


# -- building and reading ------------------------------------------------------------------


def test_every_record_reads_back_as_it_was_loaded(store: tsc.CacheStore, paths: list[str]) -> None:
    """Boxes of any count per image (fixed-shape designs broke there: ffcv#70, #121, #313),
    every field read back under its own key (fields misaligned with keys: ffcv#231)."""
    assert len(store) == len(paths) and store.spec.records and store.spec.format_version == 2
    assert store.spec.item_shape is None and store.spec.dtype is None
    assert [f.name for f in store.spec.fields] == list(BOX_FIELDS)
    assert [f.field for f in store.spec.fields] == list(BOX_FIELDS.values())
    for p in paths:
        rec = store[p]
        assert isinstance(rec, tsc.Record) and same(rec, expected(p, boxes=True)), p
    assert store.get("absent") is None and paths[0] in store
    with pytest.raises(tsc.KeyNotInStoreError):
        store["absent"]


def test_a_record_is_a_read_only_mapping_of_copy_on_write_views(
    store: tsc.CacheStore, paths: list[str]
) -> None:
    rec = store[paths[7]]
    assert rec.image is rec["image"] and rec.title is rec["title"]
    assert dict(rec).keys() == BOX_FIELDS.keys() and len(rec) == len(BOX_FIELDS)
    with pytest.raises(AttributeError):
        rec.image = np.zeros(1)
    with pytest.raises(TypeError):
        rec["image"] = np.zeros(1)
    with pytest.raises(AttributeError, match="no field 'nope'"):
        rec.nope  # noqa: B018
    # a read-only dict: every way of changing it refused, nothing changed
    changes: list[Callable[[Any], object]] = [lambda r: r.__delitem__("image"), lambda r: r.pop("image"), lambda r: r.popitem(),
               lambda r: r.clear(), lambda r: r.update(image=1), lambda r: r.setdefault("x", 1),
               lambda r: r.__ior__({"x": 1})]
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change(rec)
    assert list(rec) == list(BOX_FIELDS) and dict in type(rec).__mro__
    for clone in (pickle.loads(pickle.dumps(rec)), copy.deepcopy(rec)):  # a worker's record
        assert type(clone) is tsc.Record and list(clone) == list(rec) and same(clone, rec)
    for mutable in (rec.copy(), copy.copy(rec)):  # a copy is a plain dict of the same views
        mutable["extra"] = 1
        assert type(mutable) is dict and mutable["image"] is rec["image"]
    # a field may be named as a dict method: the attribute is the field, as for every field
    named = tsc.Record({"copy": rec["image"], "update": rec["title"], "pop": 1})
    assert named.copy is named["copy"] and named.update == rec.title
    assert getattr(named, "pop") == 1  # noqa: B009 (typed as the method)
    assert type(rec.copy()) is dict and "copy" in dir(named)
    for name in ("image", "title_ids", "boxes", "pic"):
        view = rec[name]
        assert not view.flags.owndata and view.flags.writeable, name
    assert rec.rating.shape == () and not rec.rating.flags.owndata  # a 0-d view
    # writing to a view changes this process's copy only, never the file
    rec.image[...] = 99
    rec.title_ids[...] = -1
    again = tsc.open_store(store.location)
    assert same(again[paths[7]], expected(paths[7], boxes=True))
    again.close()


def test_a_batch_is_one_gather_per_field_in_schema_order(
    store: tsc.CacheStore, paths: list[str]
) -> None:
    rng = np.random.default_rng(3)
    keys = [paths[i] for i in rng.integers(0, len(paths), 64)]
    want = [expected(p, boxes=True) for p in keys]
    b = store.take(store.rows(keys))
    assert list(b) == list(BOX_FIELDS)
    np.testing.assert_array_equal(b["image"], np.stack([w["image"] for w in want]))
    assert b["rating"].shape == (64,) and b["rating"].dtype == np.float32
    np.testing.assert_array_equal(b["rating"], [w["rating"] for w in want])
    assert b["title"] == [w["title"] for w in want]
    ids = b["title_ids"]
    assert isinstance(ids, tsc.Ragged) and len(ids) == 64
    assert ids.offsets is not None and ids.offsets.dtype == np.int64 and ids.offsets[0] == 0 and len(ids.offsets) == 65
    assert ids.lengths.dtype == np.int64
    np.testing.assert_array_equal(ids.lengths, [len(w["title_ids"]) for w in want])
    for i, w in enumerate(want):
        np.testing.assert_array_equal(ids[i], w["title_ids"])
    padded = ids.pad(value=-7)
    assert padded.shape == (64, int(ids.lengths.max()))
    for i, w in enumerate(want):
        n = len(w["title_ids"])
        np.testing.assert_array_equal(padded[i, :n], w["title_ids"])
        assert (padded[i, n:] == -7).all()
    cut = ids.pad(max_len=3)
    assert cut.shape == (64, 3)
    np.testing.assert_array_equal(cut[0, : min(3, len(want[0]["title_ids"]))],
                                  want[0]["title_ids"][:3])
    boxes = b["boxes"]
    assert boxes.values.shape[1:] == (4,) and boxes.shapes is None
    for i, w in enumerate(want):
        np.testing.assert_array_equal(boxes[i], w["boxes"])
    pic = b["pic"]
    assert pic.shapes is not None and pic.shapes.shape == (64, 2)
    np.testing.assert_array_equal(pic.lengths, pic.shapes[:, 0])  # the first varying dimension
    for i, w in enumerate(want):
        np.testing.assert_array_equal(pic[i], w["pic"])
    full = pic.pad()
    assert full.shape == (64, 3, int(pic.shapes[:, 0].max()), int(pic.shapes[:, 1].max()))
    h, w2 = want[5]["pic"].shape[1:]
    np.testing.assert_array_equal(full[5, :, :h, :w2], want[5]["pic"])
    assert (full[5, :, h:, :] == 0).all()


def test_tensor_only_options_are_refused_on_records(store: tsc.CacheStore) -> None:
    with pytest.raises(TypeError, match="field"):
        store.take([0, 1], out=np.empty((2, 3, 4, 4), np.uint8))
    with pytest.raises(TypeError, match="field"):
        store.dtype  # noqa: B018


def test_a_field_is_a_store_with_the_whole_api(store: tsc.CacheStore, paths: list[str]) -> None:
    images = store.field("image")
    assert images.spec.item_shape == (3, 4, 4) and images.dtype == np.uint8
    assert images.shape == (len(paths), 3, 4, 4)
    np.testing.assert_array_equal(images[paths[3]], expected(paths[3])["image"])
    rows = images.rows(paths[:10])
    out = np.empty((10, 3, 4, 4), np.uint8)
    assert images.take(rows, out=out) is out
    np.testing.assert_array_equal(out, np.stack([expected(p)["image"] for p in paths[:10]]))
    np.testing.assert_array_equal(images.stack(paths[:10]), out)
    series = images.series(paths[:5])
    np.testing.assert_array_equal(series.iloc[2], expected(paths[2])["image"])
    titles = store.field("title")
    assert titles[paths[4]] == "book 4" and titles.take([4, 5]) == ["book 4", "book 5"]
    ids = store.field("title_ids")
    np.testing.assert_array_equal(ids[paths[8]], expected(paths[8])["title_ids"])
    with pytest.raises(KeyError, match="no field 'nope'"):
        store.field("nope")
    # a field pickles and reopens as that field
    clone = pickle.loads(pickle.dumps(images))
    np.testing.assert_array_equal(clone[paths[3]], images[paths[3]])
    images.close()  # shares the store's mappings: the store stays open
    assert same(store[paths[1]], expected(paths[1], boxes=True))


def test_series_and_frame(store: tsc.CacheStore, paths: list[str]) -> None:
    pd = pytest.importorskip("pandas")
    keys = pd.Series([paths[5], paths[2], paths[5]], index=[10, 20, 30])
    series = store.series(keys)
    assert list(series.index) == [10, 20, 30] and same(series[10], expected(paths[5], boxes=True))
    frame = store.frame(keys)
    assert list(frame.columns) == list(BOX_FIELDS) and list(frame.index) == list(keys)
    assert frame["rating"].dtype == np.float32 and frame["rating"].iloc[1] == np.float32(0.5)
    assert frame["title"].tolist() == ["book 5", "book 2", "book 5"]
    np.testing.assert_array_equal(frame["title_ids"].iloc[0], expected(paths[5])["title_ids"])
    only = store.frame(paths[:3], fields=["title"])
    assert list(only.columns) == ["title"]


def test_stock_zarr_and_tensorstore_read_every_field(store: tsc.CacheStore, paths: list[str]) -> None:
    zarr = pytest.importorskip("zarr")
    g = zarr.open_group(store.location, mode="r")
    rows = store.rows(paths[:20])
    np.testing.assert_array_equal(g["fields/image"][rows[3]], expected(paths[3])["image"])
    o = g["fields/title_ids/offsets"][:]
    np.testing.assert_array_equal(g["fields/title_ids/values"][o[rows[7]] : o[rows[7] + 1]],
                                  expected(paths[7])["title_ids"])
    text = g["fields/title/values"][:]
    to = g["fields/title/offsets"][:]
    assert bytes(text[to[rows[9]] : to[rows[9] + 1]]).decode() == "book 9"
    shapes = g["fields/pic/shapes"][:]
    po = g["fields/pic/offsets"][:]
    pic = g["fields/pic/values"][po[rows[4]] : po[rows[4] + 1]].reshape(3, *shapes[rows[4]])
    np.testing.assert_array_equal(pic, expected(paths[4], boxes=True)["pic"])
    ts = pytest.importorskip("tensorstore")
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file",
                                                   "path": f"{store.location}/fields/title_ids/values/"}}).result()
    np.testing.assert_array_equal(arr[int(o[rows[7]]) : int(o[rows[7] + 1])].read().result(),
                                  expected(paths[7])["title_ids"])


def test_a_ragged_row_across_two_chunks_is_still_one_view(
    paths: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorstore_cache.writer import ragged

    monkeypatch.setattr(ragged, "RAGGED_CHUNK_BYTES", 4096)  # 1,024 int32 ids a chunk
    many = write_sources(tmp_path / "many", 400, start=1000)
    s = tsc.build_store(many, tmp_path / "small.tsc", loader=RecordLoader(), loader_id="records/1",
                        fields=FIELDS, workers=1, progress=False)
    layout = next(f for f in s.spec.fields if f.name == "title_ids")
    assert layout.chunk == 1024 and layout.shard_count() >= 2
    ids = s.field("title_ids")
    straddling = 0
    for p in many:
        row = int(s.rows([p])[0])
        start, stop = view_of(s).segments[0].ragged("title_ids").spans(np.array([row]))
        view = ids[p]
        np.testing.assert_array_equal(view, expected(p)["title_ids"])
        if start[0] // 1024 != (stop[0] - 1) // 1024:
            straddling += 1
            assert not view.flags.owndata  # one view over both chunk files
    assert straddling > 0
    assert tsc.verify_store(s).ok


# -- the cache -------------------------------------------------------------------------------


def test_cached_records_build_once_add_incrementally_and_merge(
    tmp_path: Path, paths: list[str]
) -> None:
    cache, log = tmp_path / "cache", tmp_path / "log"
    loader = RecordLoader(log)
    for step in range(11):  # every call adds 10 new keys: enough parts for a merge
        want = paths[: 60 + step * 10]
        s = tsc.cached(want, loader=loader, loader_id="records/1", fields=FIELDS,
                       cache_dir=cache, workers=1, progress=False)
        assert all(same(s[p], expected(p)) for p in want)
        parts = len(view_of(s).segments)
        s.close()
    assert parts < 11, "the parts were merged"
    assert calls(log) == Counter(paths[:160]), "each record computed once, merges copy"
    again = tsc.cached(paths[:160], loader=loader, loader_id="records/1", fields=FIELDS,
                       cache_dir=cache, workers=1, progress=False)
    assert calls(log) == Counter(paths[:160]) and again.report().ok


def test_cached_records_detect_stale_sources(tmp_path: Path, paths: list[str]) -> None:
    cache, log = tmp_path / "cache", tmp_path / "log"
    loader = RecordLoader(log)
    tsc.cached(paths[:30], loader=loader, loader_id="records/1", fields=FIELDS,
               cache_dir=cache, workers=1, progress=False).close()
    Path(paths[4]).write_text("9999")
    s = tsc.cached(paths[:30], loader=loader, loader_id="records/1", fields=FIELDS,
                   cache_dir=cache, workers=1, progress=False)
    assert same(s[paths[4]], expected(paths[4])) and number(paths[4]) == 9999
    assert calls(log)[paths[4]] == 2 and sum(calls(log).values()) == 31


def test_skipped_records_are_listed_and_retried(tmp_path: Path, paths: list[str]) -> None:
    cache = tmp_path / "cache"
    loader = RecordLoader(fail=(3, 17))
    s = tsc.cached(paths[:40], loader=loader, loader_id="records/1", fields=FIELDS,
                   cache_dir=cache, workers=1, progress=False, on_error="skip")
    assert len(s) == 38 and {k for k, _r in s.spec.skipped} == {paths[3], paths[17]}
    assert all(same(s[p], expected(p)) for p in paths[:40] if number(p) not in (3, 17))
    fixed = tsc.cached(paths[:40], loader=RecordLoader(), loader_id="records/1", fields=FIELDS,
                       cache_dir=cache, workers=1, progress=False)
    assert len(fixed) == 40 and same(fixed[paths[3]], expected(paths[3]))


def test_the_schema_names_the_namespace(tmp_path: Path, paths: list[str]) -> None:
    cache = tmp_path / "cache"
    a = tsc.cached(paths[:5], loader=RecordLoader(), loader_id="records/1", fields=FIELDS,
                   cache_dir=cache, workers=1, progress=False)
    other = {**FIELDS, "title_ids": tsc.Ragged("int64")}

    def load64(p: str) -> dict[str, Any]:
        r = expected(p)
        r["title_ids"] = r["title_ids"].astype(np.int64)
        return r

    b = tsc.cached(paths[:5], loader=load64, loader_id="records/1", fields=other,
                   cache_dir=cache, workers=1, progress=False)
    assert a.location != b.location
    assert b[paths[2]]["title_ids"].dtype == np.int64


def test_an_inferred_schema_is_recorded_and_enforced(tmp_path: Path, paths: list[str]) -> None:
    cache = tmp_path / "cache"

    def load(p: str) -> dict[str, Any]:  # title_ids of one length for the first keys only
        r = expected(p)
        r["title_ids"] = np.full(2 if number(p) < 10 else 3, number(p), np.int32)
        return r

    s = tsc.cached(paths[:10], loader=load, loader_id="records/inferred", cache_dir=cache,
                   workers=1, progress=False)
    assert [f.field for f in s.spec.fields] == [
        tsc.Fixed((3, 4, 4), "uint8"), tsc.Fixed((2,), "int32"), tsc.Fixed((), "float32"),
        tsc.Text(),
    ]
    with pytest.raises(tsc.BuildError, match=r"field 'title_ids' must have shape \(2,\).*Ragged"):
        tsc.cached(paths[:12], loader=load, loader_id="records/inferred", cache_dir=cache,
                   workers=1, progress=False)


def test_records_are_computed_once_by_racing_processes(tmp_path: Path, paths: list[str]) -> None:
    cache, log = tmp_path / "cache", tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_race, args=(paths[:80], str(cache), str(log), barrier))
             for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN_S)
        assert p.exitcode == 0
    assert calls(log) == Counter(paths[:80])


def _race(paths: list[str], cache: str, log: str, barrier: Any) -> None:
    barrier.wait()
    s = tsc.cached(paths, loader=RecordLoader(log), loader_id="records/1", fields=FIELDS,
                   cache_dir=cache, workers=2, progress=False)
    assert all(same(s[p], expected(p)) for p in paths)


# -- records as loaders return them ----------------------------------------------------------


def _build(tmp_path: Path, loader: Any, **kw: Any) -> tsc.CacheStore:
    keys = write_sources(tmp_path / "few", 4)
    return tsc.build_store(keys, tmp_path / f"s{len(list(tmp_path.iterdir()))}.tsc",
                           loader=loader, loader_id="records/x", workers=1, progress=False, **kw)


def test_a_tuple_needs_its_names(tmp_path: Path) -> None:
    """Positional tuples get mixed up (ffcv#103): a tuple is refused until its fields are named."""
    def pair(p: str) -> tuple[Any, Any]:
        return np.full(3, number(p), np.uint8), np.int64(number(p))

    with pytest.raises(tsc.BuildError, match=r"tuple of 2 values.*pass fields="):
        _build(tmp_path, pair)
    s = _build(tmp_path, pair, fields=("image", "label"))
    rec = s[s.paths[2]]
    assert list(rec) == ["image", "label"] and int(rec.label) == 2


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"image": np.zeros((3, 4, 4), np.float32)}, r"field 'image' must be uint8.*float32"),
        ({"image": np.zeros((3, 4, 5), np.uint8)}, r"field 'image' must have shape \(3, 4, 4\)"),
        ({"title_ids": np.zeros((2, 2), np.int32)}, r"field 'title_ids' must have shape \(None,\)"),
        ({"title_ids": [1, 2, 2**40]}, r"field 'title_ids' must be int32"),
        ({"title": b"bytes"}, r"field 'title' is text"),
        ({"rating": "4.5"}, r"field 'rating' must be float32"),
    ],
)
def test_a_record_that_breaks_the_schema_names_key_field_and_what_came(
    tmp_path: Path, value: dict[str, Any], match: str
) -> None:
    def load(p: str) -> dict[str, Any]:
        r = expected(p)
        r.update(value)
        return r

    with pytest.raises(tsc.BuildError) as info:
        _build(tmp_path, load, fields=FIELDS)
    assert info.match(match) and info.match("few/0.bin")


def test_python_values_convert_only_when_they_survive(tmp_path: Path) -> None:
    def load(p: str) -> dict[str, Any]:
        r = expected(p)
        r["title_ids"] = [number(p), 7]  # Python ints that int32 holds
        r["rating"] = 0.1 * number(p)  # a Python float, rounded to float32
        return r

    s = _build(tmp_path, load, fields=FIELDS)
    rec = s[s.paths[3]]
    assert rec.title_ids.tolist() == [3, 7] and rec.rating.dtype == np.float32
    assert float(rec.rating) == pytest.approx(0.3, rel=1e-6)


def test_missing_and_extra_fields_are_named(tmp_path: Path) -> None:
    def load(p: str) -> dict[str, Any]:
        r = expected(p)
        del r["title"]
        r["extra"] = 1
        return r

    with pytest.raises(tsc.BuildError, match=r"missing \['title'\]; not in the store: \['extra'\]"):
        _build(tmp_path, load, fields=FIELDS)


def test_inferred_float64_is_refused_with_a_way_out(tmp_path: Path) -> None:
    def load(p: str) -> dict[str, Any]:
        return {"score": 0.5 * number(p), "image": np.zeros(3, np.uint8)}

    with pytest.raises(tsc.BuildError, match=r"float64.*declare its type with fields="):
        _build(tmp_path, load)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"Image": tsc.Text()}, "lowercase"),
        ({"vectors": tsc.Text()}, "reserved"),
        ({"key_x": tsc.Text()}, "reserved"),
        ({"keys": tsc.Text()}, "reserved"),
        ({"ids": tsc.Ragged("int32"), "ids_len": tsc.Text()}, "clashes"),
        ({"a": "int32"}, "declare it as tsc.Fixed"),
    ],
)
def test_field_names_and_kinds_are_checked(
    tmp_path: Path, fields: dict[str, Any], match: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        _build(tmp_path, RecordLoader(), fields=fields)


def test_a_declaration_is_not_a_batch() -> None:
    with pytest.raises(TypeError, match="declaration"):
        len(tsc.Ragged("int32"))
    with pytest.raises(ValueError, match="None where a dimension varies"):
        tsc.Ragged("int32", shape=(3, 4))
    with pytest.raises(ValueError, match="not allowed"):
        tsc.Fixed((3,), "object")


def test_records_in_a_worker_pool(paths: list[str], tmp_path: Path) -> None:
    log = tmp_path / "log"
    s = tsc.build_store(paths, tmp_path / "pool.tsc", loader=RecordLoader(log, boxes=True),
                        loader_id="records/1", fields=BOX_FIELDS, workers=2, progress=False)
    assert len({pid for pid, _k in log_lines(log)}) == 2, "two processes built"
    assert calls(log) == Counter(paths)
    assert all(same(s[p], expected(p, boxes=True)) for p in paths)
    assert s.report().ok
    assert os.path.isdir(Path(s.location) / "fields") and not (Path(s.location) / "runs").exists()


def test_take_names_a_uint64_row_out_of_range_unwrapped(store: tsc.CacheStore) -> None:
    with pytest.raises(IndexError, match=f"row {2**63 + 5} is out of range"):
        store.take(np.array([0, 2**63 + 5], np.uint64))
