"""Build, open and read a store: the core API with real files."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import tensorstore_cache as tsc
from tensorstore_cache.format.keys import normalize_key

from ..conftest import write_images
from ..support._loaders import Filled


def reference(path: str, size: tuple[int, int] = (32, 32)) -> np.ndarray:
    return tsc.ImageLoader(size=size)(path)


def test_build_open_roundtrip(images: list[str], tmp_path: Path) -> None:
    out = tmp_path / "s.tsc"
    store = tsc.build_store(images, out, workers=1, progress=False)
    assert len(store) == len(images)
    assert store.paths == [normalize_key(p) for p in images]
    with tsc.open_store(out) as again:
        for p in images[::7]:
            v = again[p]
            assert v.shape == (3, 32, 32) and v.dtype == np.float32
            np.testing.assert_array_equal(v, reference(p))
    assert store.spec.n == len(images)
    assert store.spec.loader_id == "tensorstore_cache.image/1"
    assert store.spec.item_shape == (3, 32, 32)


def test_parallel_build_equals_serial_build(tmp_path: Path) -> None:
    images = write_images(tmp_path / "many", 400, seed=3, gray_every=9)
    one = tsc.build_store(images, tmp_path / "one.tsc", workers=1, progress=False)
    two = tsc.build_store(images, tmp_path / "two.tsc", workers=2, progress=False)
    assert two.spec.rows_per_shard < len(images)  # several shards, several writers
    np.testing.assert_array_equal(one.take(np.arange(len(one))), two.take(np.arange(len(two))))


def test_duplicates_stored_once_in_first_seen_order(images: list[str], tmp_path: Path) -> None:
    shuffled = images[5:] + images[:5] + images[::3]
    store = tsc.build_store(shuffled, tmp_path / "s.tsc", workers=1, progress=False)
    assert len(store) == len(images)
    assert store.paths == list(dict.fromkeys(normalize_key(p) for p in shuffled))
    rows = store.rows(shuffled)
    np.testing.assert_array_equal(store.take(rows)[3], reference(shuffled[3]))


def test_mapping_protocol(images: list[str], tmp_path: Path) -> None:
    store = tsc.build_store(images, tmp_path / "s.tsc", workers=1, progress=False)
    missing = str(tmp_path / "nope.jpg")
    assert images[0] in store and missing not in store and 42 not in store
    assert store.get(missing) is None
    assert store.get(missing, "x") == "x"
    np.testing.assert_array_equal(store.get(images[1]), reference(images[1]))
    with pytest.raises(KeyError) as info:
        store[missing]
    assert isinstance(info.value, tsc.KeyNotInStoreError)
    assert missing in str(info.value)
    # a path written differently names the same key
    a = images[2]
    assert os.path.dirname(a) + "//./" + os.path.basename(a) in store
    assert Path(a) in store


def test_rows_names_every_missing_path(images: list[str], tmp_path: Path) -> None:
    store = tsc.build_store(images, tmp_path / "s.tsc", workers=1, progress=False)
    query = [images[0], "a/missing.jpg", images[1], "b/missing.jpg"]
    with pytest.raises(tsc.KeyNotInStoreError) as info:
        store.rows(query)
    assert info.value.missing == ["a/missing.jpg", "b/missing.jpg"]
    np.testing.assert_array_equal(store.rows(query, missing="ignore"), [0, -1, 1, -1])


def test_take_fills_out_and_checks_it(images: list[str], tmp_path: Path) -> None:
    store = tsc.build_store(images, tmp_path / "s.tsc", workers=2, progress=False)
    rows = np.random.default_rng(1).integers(0, len(images), 40)
    buf = np.empty((40, 3, 32, 32), np.float32)
    assert store.take(rows, out=buf) is buf
    for j, r in enumerate(rows):
        np.testing.assert_array_equal(buf[j], store[store.paths[r]])
    with pytest.raises(ValueError, match="shape"):
        store.take(rows, out=np.empty((39, 3, 32, 32), np.float32))
    with pytest.raises(IndexError, match="out of range"):
        store.take([len(images)])
    assert store.take([]).shape == (0, 3, 32, 32)


def test_black_and_odd_images_are_stored(tmp_path: Path) -> None:
    paths = []
    modes: list[tuple[str, Any]] = [("RGB", (0, 0, 0)), ("L", 0), ("RGBA", (0, 0, 0, 0)), ("P", 3)]
    for i, (mode, color) in enumerate(modes):
        p = tmp_path / f"x{i}.png"
        Image.new(mode, (40, 30), color).save(p)
        paths.append(str(p))
    store = tsc.build_store(paths, tmp_path / "s.tsc", workers=1, progress=False)
    np.testing.assert_array_equal(store[paths[0]], np.zeros((3, 32, 32), np.float32))
    assert all(store.take(np.arange(4)).shape == (4, 3, 32, 32) for _ in [0])
    shard = Path(store.location) / "vectors" / "c" / "0" / "0" / "0" / "0"
    assert shard.stat().st_size == 4 * 12288 + 16 * store.spec.rows_per_shard + 4
    assert store.spec.rows_per_shard == 4


def test_uint8_store_converts_to_float32_bit_identically(images: list[str], tmp_path: Path) -> None:
    f32 = tsc.build_store(images, tmp_path / "f.tsc", workers=1, progress=False)
    u8 = tsc.build_store(images, tmp_path / "u.tsc", dtype="uint8", workers=1, progress=False)
    assert u8.dtype == np.uint8
    rows = np.arange(len(images))
    assert np.array_equal(tsc.to_float32(u8.take(rows)), f32.take(rows))
    size = sum(f.stat().st_size for f in (tmp_path / "u.tsc" / "vectors").rglob("*") if f.is_file())
    assert size < len(images) * 3 * 32 * 32 + 4096 * 4


def test_custom_loader_any_shape(tmp_path: Path) -> None:
    keys = [f"item-{i}" for i in range(25)]
    store = tsc.build_store(keys, tmp_path / "s.tsc", loader=_embed, loader_id="embed/1",
                            workers=2, progress=False, identity="none")
    assert store.spec.item_shape == (7,) and store.spec.loader_id == "embed/1"
    np.testing.assert_array_equal(store["item-13"], _embed("item-13").astype(np.float32))
    assert store.spec.identity == "none"  # recorded: these keys are not files


def _embed(key: str) -> np.ndarray:
    return np.arange(7, dtype=np.float64) * int(key.split("-")[1])


def _bad_shape(key: str) -> np.ndarray:
    return np.zeros(3 if key.endswith("3") else 4)


def test_loader_shape_change_is_a_failure(tmp_path: Path) -> None:
    with pytest.raises(tsc.BuildError) as info:
        tsc.build_store(["k0", "k1", "k3", "k13"], tmp_path / "s.tsc", loader=_bad_shape,
                        workers=1, progress=False, identity="none")
    assert [p for p, _ in info.value.failures] == ["k3", "k13"]
    assert "shape" in info.value.failures[0][1]


def test_bad_images_raise_listing_all_and_publish_nothing(images: list[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    gone = str(tmp_path / "gone.jpg")
    out = tmp_path / "s.tsc"
    with pytest.raises(tsc.BuildError) as info:
        tsc.build_store([*images[:10], str(bad), gone], out, workers=2, progress=False)
    assert [p for p, _ in info.value.failures] == [str(bad), gone]
    assert "FileNotFoundError" in info.value.failures[1][1]
    assert "on_error='skip'" in str(info.value)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".s.tsc")]
    err = pickle.loads(pickle.dumps(info.value))
    assert err.failures == info.value.failures


def test_skip_builds_the_rest(images: list[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8 truncated")
    paths = [*images[:20], str(bad), *images[20:]]
    store = tsc.build_store(paths, tmp_path / "s.tsc", workers=2, on_error="skip", progress=False)
    assert len(store) == len(images)
    assert [p for p, _ in store.spec.skipped] == [str(bad)]
    assert str(bad) not in store
    np.testing.assert_array_equal(store.take(store.rows(images)), np.stack([reference(p) for p in images]))
    again = tsc.open_store(tmp_path / "s.tsc")
    assert again.spec.skipped == store.spec.skipped


def test_refuses_to_overwrite_unless_asked(images: list[str], tmp_path: Path) -> None:
    out = tmp_path / "s.tsc"
    tsc.build_store(images[:5], out, workers=1, progress=False)
    with pytest.raises(tsc.StoreExistsError) as info:
        tsc.build_store(images, out, workers=1, progress=False)
    assert isinstance(info.value, FileExistsError) and "overwrite=True" in str(info.value)
    old = tsc.open_store(out)
    kept = old[images[0]].copy()
    new = tsc.build_store(images, out, workers=1, progress=False, overwrite=True)
    assert len(new) == len(images)
    np.testing.assert_array_equal(old[images[0]], kept)  # the old mapping still reads


def test_empty_store(tmp_path: Path) -> None:
    store = tsc.build_store([], tmp_path / "e.tsc", progress=False)
    assert len(store) == 0 and store.paths == [] and "x" not in store
    assert tsc.open_store(tmp_path / "e.tsc").take([]).shape == (0, 3, 32, 32)
    with pytest.raises(ValueError, match="item_shape"):
        tsc.build_store([], tmp_path / "f.tsc", loader=_embed_k, progress=False)


@pytest.mark.parametrize("n", [1, 7, 130])
def test_tiny_stores(tmp_path: Path, n: int) -> None:
    paths = [f"k{i}" for i in range(n)]
    store = tsc.build_store(paths, tmp_path / "s.tsc", loader=_embed_k, loader_id="k/1",
                            workers=1, progress=False, identity="none")
    assert len(store) == n
    again = tsc.open_store(tmp_path / "s.tsc")
    assert again.paths == paths
    assert again.take(np.arange(n)).shape[0] == n


_embed_k = Filled((2, 3))


def test_torch_from_numpy_without_warning_and_copy_on_write(images: list[str], tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    store = tsc.build_store(images, tmp_path / "s.tsc", workers=1, progress=False)
    v = store[images[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = torch.from_numpy(v)
    assert t.data_ptr() == v.__array_interface__["data"][0]  # shares memory, no copy
    t.fill_(7.0)  # writes only this process's private copy of the page
    fresh = tsc.open_store(tmp_path / "s.tsc")
    np.testing.assert_array_equal(fresh[images[0]], reference(images[0]))


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(tsc.StoreNotFoundError) as info:
        tsc.open_store(tmp_path / "missing.tsc")
    assert isinstance(info.value, FileNotFoundError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(tsc.StoreNotFoundError):
        tsc.open_store(tmp_path / "empty")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    with pytest.raises(tsc.CorruptStoreError, match="not a tensorstore_cache store"):
        tsc.open_store(tmp_path / "plain")


def test_closed_store_refuses_reads(images: list[str], tmp_path: Path) -> None:
    store = tsc.build_store(images[:3], tmp_path / "s.tsc", workers=1, progress=False)
    v = store[images[0]]
    store.close()
    assert float(v.sum()) >= 0  # views handed out stay valid
    with pytest.raises(ValueError, match="closed"):
        store[images[0]]


def test_store_pickles_as_its_location(images: list[str], tmp_path: Path) -> None:
    store = tsc.build_store(images, tmp_path / "s.tsc", workers=1, progress=False)
    data = pickle.dumps(store)
    assert len(data) < 1000
    np.testing.assert_array_equal(pickle.loads(data)[images[4]], store[images[4]])


def test_stock_zarr_and_tensorstore_read_identical_values(images: list[str], tmp_path: Path) -> None:
    zarr = pytest.importorskip("zarr")
    ts = pytest.importorskip("tensorstore")
    store = tsc.build_store(images, tmp_path / "s.tsc", workers=2, progress=False)
    ours = store.take(np.arange(len(store)))
    group = zarr.open_group(str(tmp_path / "s.tsc"), mode="r")
    np.testing.assert_array_equal(group["vectors"][:], ours)
    order = np.argsort(group["key_hash"][:])
    assert np.all(order == np.arange(len(store)))
    spec: dict[str, Any] = {
        "driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "s.tsc" / "vectors")}
    }
    np.testing.assert_array_equal(ts.open(spec).result().read().result(), ours)
    for name in ("key_hash", "key_row", "key_offsets", "key_bytes", "source_size", "source_mtime_ns"):
        spec["kvstore"]["path"] = str(tmp_path / "s.tsc" / name)
        np.testing.assert_array_equal(ts.open(spec).result().read().result(), group[name][:])


def test_public_api_is_curated() -> None:
    assert tsc.__all__ == sorted(tsc.__all__)
    for name in tsc.__all__:
        assert hasattr(tsc, name)
    for err in (tsc.BuildError, tsc.CorruptStoreError, tsc.KeyNotInStoreError, tsc.StoreNotFoundError):
        assert issubclass(err, tsc.TensorStoreCacheError)


def test_shard_with_rows_out_of_layout_order_is_read_through_its_index(tmp_path: Path) -> None:
    # zarr's index may place inner chunks anywhere; such a shard is read row by row
    import google_crc32c

    keys = [f"k{i}" for i in range(7)]
    store = tsc.build_store(keys, tmp_path / "s.tsc", loader=_embed_k, loader_id="k/1",
                            workers=1, progress=False, identity="none")
    expected = store.take(np.arange(7))
    store.close()
    shard = tmp_path / "s.tsc" / "vectors" / "c" / "0" / "0" / "0"
    raw = shard.read_bytes()
    s, item = store.spec.rows_per_shard, store.spec.item_nbytes
    data, index = raw[: 7 * item], np.frombuffer(raw[7 * item : -4], "<u8").reshape(s, 2).copy()
    order = [6, 5, 4, 3, 2, 1, 0]  # row i now stored in slot order[i]
    moved = bytearray(len(data))
    for i, slot in enumerate(order):
        moved[slot * item : (slot + 1) * item] = data[i * item : (i + 1) * item]
        index[i, 0] = slot * item
    tail = index.tobytes()
    shard.chmod(0o644)
    shard.write_bytes(bytes(moved) + tail + google_crc32c.value(tail).to_bytes(4, "little"))
    again = tsc.open_store(tmp_path / "s.tsc")
    np.testing.assert_array_equal(again.take(np.arange(7)), expected)
    np.testing.assert_array_equal(again.take([5, 0, 5]), expected[[5, 0, 5]])
    np.testing.assert_array_equal(again["k3"], expected[3])
