"""Hostile stores: rejected fast, with a clear error, in bounded memory, running no code.

A store is data someone else may have written. Opening one parses only
JSON, through an allowlist, and maps files only after their sizes are
checked. These tests hand ``open_store`` metadata built to hurt (absurd
shapes, object dtypes, pickle codecs, huge or deeply nested JSON, paths that
escape the store, symlinks, FIFOs), fuzz every parsed file with hypothesis,
and prove that opening and reading never unpickles anything.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorstore_cache as tsc
from tensorstore_cache import verify_store

from ..support._damage import damage_is_named
from ..support._loaders import Filled
from ..support.strategies import json_values, mutated_json

REPO = Path(__file__).resolve().parents[2]
N = 150  # three shards: 64, 64, 22 rows
ITEM = (3, 4, 4)
ATTR = "tensorstore_cache"


_vec = Filled(ITEM, offset=1)


def _keys() -> list[str]:
    return [f"src/k{i:04d}.bin" for i in range(N)]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "s.tsc"
    tsc.build_store(_keys(), root, loader=_vec, loader_id="vec/1", workers=1,
                    progress=False, identity="none").close()
    return root


@pytest.fixture
def store_copy(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "s.tsc"
    shutil.copytree(pristine, root)
    return root


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _edit(path: Path, change: Callable[[Any], Any]) -> None:
    doc = _load(path)
    out = change(doc)
    path.write_text(json.dumps(doc if out is None else out))


def _attrs(change: Callable[[dict[str, Any]], None]) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        change(doc["attributes"][ATTR])
    return edit


def assert_rejected(root: Path, match: str, *, named: Path | None = None,
                    max_peak: int = 4 << 20) -> tsc.CorruptStoreError:
    """open_store raises CorruptStoreError matching ``match`` with a small allocation peak."""
    tracemalloc.start()
    try:
        with pytest.raises(tsc.CorruptStoreError, match=match) as info:
            tsc.open_store(root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < max_peak, f"rejecting it allocated {peak / 1e6:.1f} MB"
    where = named if named is not None else root / "zarr.json"
    assert info.value.path == str(where) and str(where) in str(info.value)
    return info.value


# -- absurd shapes and types ---------------------------------------------------------

@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: a.update(n=2**62), r"n must be an integer in \[0, 1099511627776\]"),
        (lambda a: a.update(n=-1), "n must be an integer"),
        (lambda a: a.update(n=2**40, rows_per_shard=1), "file list has 16 entries but"),
        (lambda a: a.update(n=True), "n must be an integer"),
        (lambda a: a.update(n=150.0), "n must be an integer"),
        (lambda a: a.update(item_shape=[-3, 4, 4]), "item_shape size"),
        (lambda a: a.update(item_shape=[0, 4, 4]), "item_shape size"),
        (lambda a: a.update(item_shape=[]), "item_shape must be a list of 1 to 8"),
        (lambda a: a.update(item_shape=[2] * 9), "item_shape must be a list of 1 to 8"),
        (lambda a: a.update(item_shape=[2**31, 2**31]), "too large"),
        (lambda a: a.update(item_shape="3,4,4"), "item_shape must be a list"),
        (lambda a: a.update(rows_per_shard=2**40, item_shape=[2], dtype="uint8"), "too large"),
        (lambda a: a.update(rows_per_shard=0), "rows_per_shard must be"),
        (lambda a: a.update(dtype="|O"), "dtype '|O' is not allowed"),
        (lambda a: a.update(dtype="object"), "dtype 'object' is not allowed"),
        (lambda a: a.update(dtype="O"), "is not allowed"),
        (lambda a: a.update(dtype="<U10"), "is not allowed"),
        (lambda a: a.update(dtype="V12"), "is not allowed"),
        (lambda a: a.update(dtype=">f4"), "is not allowed"),
        (lambda a: a.update(dtype=["float32"]), "is not allowed"),
        (lambda a: a.update(format_version=3), "upgrade tensorstore_cache or rebuild"),
        (lambda a: a.update(format_version=2), "fields must be a list"),
        (lambda a: a.pop("format_version"), "format version None"),
        (lambda a: a.update(key_bytes_len=-5), "key_bytes_len must be"),
        (lambda a: a.update(loader_id="x" * 5000), "loader_id must be a short string"),
        (lambda a: a.update(loader_params=[1, 2]), "loader_params must be an object"),
        (lambda a: a.update(skipped=[["a"]]), "skipped must be a list"),
        (lambda a: a.update(files=[]), "files must be an object"),
        (lambda a: a.update(evil={"a": 1}), "a key it does not know"),
        (lambda a: a.pop("checksum"), "never writes"),
        (lambda a: a.update(checksum="md5"), "never writes"),
        (lambda a: a.update(created_unix=True), "never writes"),
        (lambda a: a.update(item_shape=[3, 4, 5]), "does not agree with itself"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_absurd_attributes_are_rejected(store_copy: Path, change: Callable[[Any], None],
                                        match: str) -> None:
    _edit(store_copy / "zarr.json", _attrs(change))
    assert_rejected(store_copy, match)


def _file_key(rel: str, new: str) -> Callable[[Any], None]:
    def change(a: dict[str, Any]) -> None:
        files = a["files"]
        files[new] = files.pop(rel)
    return change


@pytest.mark.parametrize(
    "new",
    ["../outside", "/etc/passwd", "vectors/c/0/0/0/0/../../../../../../x",
     "vectors/c/0/0/0/0\x00", "vectors\\c\\0\\0\\0\\0", "./vectors/c/0/0/0/0", ""],
)
def test_file_list_entries_that_escape_or_lie_are_rejected(store_copy: Path, new: str) -> None:
    _edit(store_copy / "zarr.json", _attrs(_file_key("vectors/c/0/0/0/0", new)))
    assert_rejected(store_copy, "file list does not match")


@pytest.mark.parametrize(
    "entry", [[-1, "0" * 32], [1.5, "0" * 32], [10, "zz" * 16], [10, "0" * 31], [10], "x",
              [2**70, "0" * 32], [True, "0" * 32]],
)
def test_bad_file_entries_are_rejected(store_copy: Path, entry: Any) -> None:
    def change(a: dict[str, Any]) -> None:
        a["files"]["vectors/c/0/0/0/0"] = entry
    _edit(store_copy / "zarr.json", _attrs(change))
    if entry == [2**70, "0" * 32]:  # a well-formed entry that lies about the size
        with tsc.open_store(store_copy) as store, pytest.raises(tsc.CorruptStoreError) as info:
            store.take([0])
        assert "bytes but the store recorded" in str(info.value)
        return
    assert_rejected(store_copy, "file entry for 'vectors/c/0/0/0/0'")


# -- array metadata: codecs, dtypes and shapes outside the allowlist ---------------------

def _codecs(change: Callable[[list[Any]], None]) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        change(doc["codecs"])
    return edit


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda d: d.update(shape=[2**62, 3, 4, 4]), "shape 2**62"),
        (lambda d: d.update(shape=[-150, 3, 4, 4]), "negative shape"),
        (lambda d: d.update(data_type="object"), "object dtype"),
        (lambda d: d.update(data_type="|O"), "|O dtype"),
        (lambda d: d.update(data_type="<U10"), "unicode dtype"),
        (lambda d: d.update(data_type="float64"), "other dtype"),
        (_codecs(lambda c: c.append({"name": "evil_codec"})), "unknown codec"),
        (_codecs(lambda c: c.insert(0, {"name": "numcodecs.pickles", "configuration": {}})),
         "pickle filter"),
        (_codecs(lambda c: c[0]["configuration"]["codecs"].append(
            {"name": "gzip", "configuration": {"level": 5}})), "gzip codec"),
        (_codecs(lambda c: c[0]["configuration"]["codecs"][0]["configuration"].update(
            endian="big")), "big endian"),
        (lambda d: d.update(filters=[{"id": "pickle"}]), "v2-style pickle filter"),
        (lambda d: d.update(fill_value="NaN"), "fill value"),
        (lambda d: d.update(storage_transformers=[{"name": "x"}]), "storage transformer"),
        (lambda d: d.update(zarr_format=2), "zarr v2"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_array_metadata_outside_the_allowlist_is_rejected(
    store_copy: Path, edit: Callable[[Any], None], why: str
) -> None:
    path = store_copy / "vectors" / "zarr.json"
    _edit(path, edit)
    assert_rejected(store_copy, "does not describe the array this store needs", named=path)


def test_index_array_metadata_outside_the_allowlist_is_rejected(store_copy: Path) -> None:
    path = store_copy / "key_bytes" / "zarr.json"
    _edit(path, lambda d: d.update(data_type="|O"))
    assert_rejected(store_copy, "does not describe the array", named=path)


# -- JSON built to exhaust the parser ----------------------------------------------------

def _group_text(pristine: Path) -> str:
    return (pristine / "zarr.json").read_text()


def test_100_mb_attribute_is_refused_before_reading(store_copy: Path) -> None:
    text = _group_text(store_copy)
    with open(store_copy / "zarr.json", "w") as f:  # valid JSON: {..., "junk": "xxx...x"}
        f.write(text[:-2] + ', "junk": "')
        for _ in range(100):
            f.write("x" * (1 << 20))
        f.write('"}\n')
    assert (store_copy / "zarr.json").stat().st_size > 100 << 20
    assert_rejected(store_copy, "more than the 67108864 allowed", max_peak=1 << 20)


def test_millions_of_tiny_values_are_refused_before_decoding(store_copy: Path) -> None:
    # 12 MB that would decode into ~4 million lists (hundreds of MB of objects)
    text = _group_text(store_copy)
    junk = "[" + ",".join(["[]"] * 4_000_000) + "]"
    (store_copy / "zarr.json").write_text(text[:-2] + f', "junk": {junk}}}\n')
    err = assert_rejected(store_copy, "JSON values", max_peak=20 << 20)
    assert "refusing it" in str(err)


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_json_is_refused(store_copy: Path, depth: int) -> None:
    text = _group_text(store_copy)
    deep = "[" * depth + "]" * depth
    (store_copy / "zarr.json").write_text(text[:-2] + f', "deep": {deep}}}\n')
    assert_rejected(store_copy, "nests JSON deeper|not valid metadata JSON")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_standard_json_constants_are_refused(store_copy: Path, constant: str) -> None:
    text = _group_text(store_copy).replace('"n": 150', f'"n": {constant}', 1)
    (store_copy / "zarr.json").write_text(text)
    assert_rejected(store_copy, "not valid metadata JSON")


def test_duplicate_keys_are_refused(store_copy: Path) -> None:
    text = _group_text(store_copy).replace('"n": 150', '"n": 150, "n": 10', 1)
    (store_copy / "zarr.json").write_text(text)
    assert_rejected(store_copy, "duplicate key 'n'")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "not valid metadata JSON"),
        (b"\x00" * 64, "not valid metadata JSON"),
        (b"\xff\xfe{\x00}\x00", "not UTF-8"),
        (b"[1, 2, 3]", "must hold a JSON object"),
        (b'"zarr"', "must hold a JSON object"),
        (b'{"zarr_format": 2, "node_type": "group"}', "is not a zarr v3 group"),
        (b'{"zarr_format": 3, "node_type": "array"}', "is not a zarr v3 group"),
        (b'{"zarr_format": 3, "node_type": "group", "attributes": {}}', "not a tensorstore_cache store"),
        (b'{"zarr_format": 3, "node_type": "group", "attributes": {"tensorstore_cache": 1}}',
         "must be an object"),
        (b"\xef\xbb\xbf{}", "not valid metadata JSON"),
    ],
)
def test_garbage_group_metadata_is_refused(store_copy: Path, raw: bytes, match: str) -> None:
    (store_copy / "zarr.json").write_bytes(raw)
    assert_rejected(store_copy, match)


# -- paths that leave the store: symlinks, FIFOs, directories --------------------------

def _outside(root: Path, rel: str) -> Path:
    """Move ``rel`` out of the store and put a symlink to it in its place."""
    target = root.parent / ("outside-" + rel.replace("/", "_"))
    (root / rel).rename(target)
    (root / rel).symlink_to(target, target_is_directory=target.is_dir())
    return root / rel


@pytest.mark.parametrize(
    ("rel", "named", "match"),
    [
        ("key_hash/c/0", "key_hash/c/0", "is a symlink to '/"),
        ("key_hash/zarr.json", "key_hash/zarr.json", "is a symlink to '/"),
        ("key_hash", "key_hash/zarr.json", r"is reached through a symlink \(key_hash\) to '/"),
        ("vectors", "vectors/zarr.json", r"is reached through a symlink \(vectors\) to '/"),
        ("zarr.json", "zarr.json", "is a symlink to '/"),
    ],
)
def test_symlinks_out_of_the_store_are_refused(store_copy: Path, rel: str, named: str,
                                               match: str) -> None:
    _outside(store_copy, rel)
    assert_rejected(store_copy, match, named=store_copy / named)


def test_shard_directory_symlinked_out_of_the_store_is_refused(store_copy: Path) -> None:
    _outside(store_copy, "vectors/c")
    with tsc.open_store(store_copy) as store, pytest.raises(tsc.CorruptStoreError) as info:
        store.take([0])
    assert "is reached through a symlink (c) to '/" in str(info.value)
    assert info.value.path == str(store_copy / "vectors/c/0/0/0/0")


def test_symlink_to_a_device_is_refused(store_copy: Path) -> None:
    (store_copy / "key_row/c/0").unlink()
    os.symlink("/dev/zero", store_copy / "key_row/c/0")
    assert_rejected(store_copy, "is a symlink to '/dev/zero'", named=store_copy / "key_row/c/0")


@pytest.mark.parametrize("rel", ["key_row/c/0", "key_row/zarr.json", "vectors/zarr.json"])
def test_symlinks_inside_the_store_are_refused_too(store_copy: Path, rel: str) -> None:
    """A store never contains symlinks; one inside means someone tampered with it."""
    (store_copy / rel).rename(store_copy / (rel + ".real"))
    os.symlink(os.path.basename(rel) + ".real", store_copy / rel)
    assert_rejected(store_copy, "is a symlink", named=store_copy / rel)


FIFO_OPEN = r"""
import sys, tensorstore_cache as tsc
try:
    tsc.open_store(sys.argv[1])
except tsc.CorruptStoreError as e:
    print("refused:", e)
"""


@pytest.mark.parametrize("rel", ["zarr.json", "vectors/zarr.json", "key_hash/c/0"])
def test_a_fifo_does_not_hang_the_reader(store_copy: Path, rel: str) -> None:
    (store_copy / rel).unlink()
    os.mkfifo(store_copy / rel)
    proc = subprocess.run([sys.executable, "-c", FIFO_OPEN, str(store_copy)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("refused:") and "regular file" in proc.stdout


def test_a_directory_in_place_of_metadata_is_refused(store_copy: Path) -> None:
    (store_copy / "vectors" / "zarr.json").unlink()
    (store_copy / "vectors" / "zarr.json").mkdir()
    assert_rejected(store_copy, "not a regular file", named=store_copy / "vectors/zarr.json")


# -- hostile index contents that pass the size checks ----------------------------------

def _rewrite_index(path: Path, rows_per_shard: int, change: Callable[[np.ndarray], None],
                   fix_crc: bool = True) -> None:
    data = bytearray(path.read_bytes())
    n = 16 * rows_per_shard
    start = len(data) - n - 4
    index = np.frombuffer(bytes(data[start : start + n]), "<u8").reshape(rows_per_shard, 2).copy()
    change(index)
    raw = index.tobytes()
    data[start : start + n] = raw
    if fix_crc:
        data[-4:] = google_crc32c.value(raw).to_bytes(4, "little")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "change",
    [
        lambda ix: ix.__setitem__((3, 0), 2**64 - 5),  # offset + nbytes wraps past 2**64
        lambda ix: ix.__setitem__((3, 0), 2**63),
        lambda ix: ix.__setitem__((3, 1), 10),  # wrong inner-chunk size
        lambda ix: ix.__setitem__((3, 1), 2**64 - 1),
        lambda ix: ix.__setitem__((63, 0), 64 * 192),  # points at the index itself
    ],
)
def test_shard_index_pointing_outside_the_data_is_refused(store_copy: Path,
                                                          change: Callable[[np.ndarray], None]) -> None:
    shard = store_copy / "vectors/c/0/0/0/0"
    _rewrite_index(shard, 64, change)
    with tsc.open_store(store_copy) as store, pytest.raises(tsc.CorruptStoreError) as info:
        store.take(np.arange(64))
    assert info.value.path == str(shard)


def test_shard_rows_out_of_order_are_still_read_right(store_copy: Path) -> None:
    """A valid zarr shard whose rows lie elsewhere (another writer) is read row by row."""
    shard = store_copy / "vectors/c/0/0/0/0"
    data = bytearray(shard.read_bytes())
    a, b = bytes(data[0:192]), bytes(data[192:384])
    data[0:192], data[192:384] = b, a
    shard.write_bytes(bytes(data))
    _rewrite_index(shard, 64, lambda ix: ix.__setitem__(slice(0, 2), ix[[1, 0]].copy()))
    with tsc.open_store(store_copy) as store:
        np.testing.assert_array_equal(store.take(np.arange(150)),
                                      np.stack([_vec(k) for k in _keys()]))


@pytest.mark.parametrize(
    ("rel", "words"),
    [
        ("key_row/c/0", lambda w: w.__setitem__(slice(None), 2**63 + 5)),  # rows < 0
        ("key_row/c/0", lambda w: w.__setitem__(slice(None), N + 7)),  # rows past the end
        ("key_offsets/c/0", lambda w: w.__setitem__(slice(None), 2**64 - 1)),
        ("key_offsets/c/0", lambda w: w.__setitem__(slice(None), w[::-1].copy())),
    ],
)
def test_hostile_key_index_is_refused_on_lookup(store_copy: Path, rel: str,
                                                words: Callable[[np.ndarray], None]) -> None:
    path = store_copy / rel
    w = np.frombuffer(path.read_bytes(), "<u8").copy()
    words(w)
    path.write_bytes(w.tobytes())
    with tsc.open_store(store_copy) as store:
        with pytest.raises(tsc.CorruptStoreError) as info:
            store["src/k0005.bin"]
        assert info.value.path == str(path)
        with pytest.raises(tsc.CorruptStoreError):
            store.rows(_keys())
        if rel.startswith("key_offsets"):
            with pytest.raises(tsc.CorruptStoreError):
                store.paths  # noqa: B018


# -- fuzzing: only the project's own errors come out -----------------------------------

def exercise(root: Path) -> str:
    """Open, look up, gather and verify; return the outcome. Any other exception escapes."""
    try:
        with tsc.open_store(root) as store:
            n = len(store)
            paths = store.paths
            assert len(paths) == n
            rows = store.rows(paths[:40], missing="ignore")
            assert rows.shape == (min(n, 40),)
            store.rows(["src/k0001.bin", "src/k0149.bin"], missing="ignore")
            for key in ("src/k0000.bin", "src/k0077.bin", *paths[:3]):
                v = store.get(key)
                assert v is None or v.shape == store.spec.item_shape
            batch = store.take(np.arange(n))
            assert batch.shape == (n, *(store.spec.item_shape or ()))
        verify_store(root)
        return "ok"
    except tsc.TensorStoreCacheError as exc:
        return type(exc).__name__


@pytest.fixture(scope="module")
def scratch(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("fuzz") / "s.tsc"
    shutil.copytree(pristine, root)
    yield root


class _Swap:
    """Replace one file's bytes for the duration of a ``with`` block."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path, self.data = path, data

    def __enter__(self) -> None:
        self.saved = self.path.read_bytes()
        self.path.write_bytes(self.data)

    def __exit__(self, *exc: object) -> None:
        self.path.write_bytes(self.saved)


FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=False).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def documents(pristine: Path) -> dict[str, Any]:
    return {rel: _load(pristine / rel) for rel in
            ("zarr.json", "vectors/zarr.json", "key_offsets/zarr.json")}


@FUZZ
@given(data=st.data())
def test_fuzz_group_metadata(scratch: Path, pristine: Path, documents: dict[str, Any],
                             data: st.DataObject) -> None:
    doc = data.draw(mutated_json(documents["zarr.json"]))
    with _Swap(scratch / "zarr.json", _dump(doc)):
        exercise(scratch)
        damage_is_named(scratch, pristine, "zarr.json")


@settings(FUZZ, max_examples=500)
@given(data=st.data())
def test_fuzz_group_attributes_deeply(scratch: Path, pristine: Path, documents: dict[str, Any],
                                      data: st.DataObject) -> None:
    """Damage inside the store description, where the interesting numbers are."""
    doc = copy.deepcopy(documents["zarr.json"])
    doc["attributes"][ATTR] = data.draw(mutated_json(doc["attributes"][ATTR], rounds=4))
    with _Swap(scratch / "zarr.json", _dump(doc)):
        exercise(scratch)
        damage_is_named(scratch, pristine, "zarr.json")


@settings(FUZZ, max_examples=200)
@given(data=st.data(), rel=st.sampled_from(["vectors/zarr.json", "key_offsets/zarr.json"]))
def test_fuzz_array_metadata(scratch: Path, pristine: Path, documents: dict[str, Any],
                             data: st.DataObject, rel: str) -> None:
    doc = data.draw(mutated_json(documents[rel]))
    with _Swap(scratch / rel, _dump(doc)):
        assert exercise(scratch) in ("ok", "CorruptStoreError")
        damage_is_named(scratch, pristine, rel)


@settings(FUZZ, max_examples=200)
@given(raw=st.one_of(st.binary(max_size=300), json_values().map(_dump)))
def test_fuzz_group_metadata_bytes(scratch: Path, pristine: Path, raw: bytes) -> None:
    with _Swap(scratch / "zarr.json", raw):
        assert exercise(scratch) == "CorruptStoreError"
        damage_is_named(scratch, pristine, "zarr.json")


@settings(FUZZ, max_examples=350)
@given(
    shard=st.integers(0, 2),
    at=st.integers(0, 16 * 64 + 3),
    junk=st.binary(min_size=1, max_size=24),
    fix_crc=st.booleans(),
)
def test_fuzz_shard_index(scratch: Path, pristine: Path, shard: int, at: int, junk: bytes,
                          fix_crc: bool) -> None:
    path = scratch / f"vectors/c/{shard}/0/0/0"
    data = bytearray(path.read_bytes())
    start = len(data) - 16 * 64 - 4
    end = min(len(data), start + at + len(junk))
    data[start + at : end] = junk[: end - start - at]
    if fix_crc:
        data[-4:] = google_crc32c.value(bytes(data[start:-4])).to_bytes(4, "little")
    with _Swap(path, bytes(data)):
        exercise(scratch)
        damage_is_named(scratch, pristine, f"vectors/c/{shard}/0/0/0")


@settings(FUZZ, max_examples=350)
@given(
    rel=st.sampled_from(["key_hash/c/0", "key_row/c/0", "key_offsets/c/0", "key_bytes/c/0"]),
    at=st.integers(0, 1199),
    words=st.lists(st.sampled_from([0, 1, 7, 149, 150, 151, 2**31, 2**32, 2**63 - 1, 2**63,
                                    2**64 - 1, 2**64 - 150]) | st.integers(0, 2**64 - 1),
                   min_size=1, max_size=8),
)
def test_fuzz_key_index(scratch: Path, pristine: Path, rel: str, at: int,
                        words: list[int]) -> None:
    path = scratch / rel
    data = bytearray(path.read_bytes())
    junk = np.array(words, dtype="<u8").tobytes()
    at = at % len(data)
    data[at : at + len(junk)] = junk[: len(data) - at]
    with _Swap(path, bytes(data)):
        exercise(scratch)
        damage_is_named(scratch, pristine, rel)


# -- nothing is ever unpickled ---------------------------------------------------------

NO_PICKLE = r"""
import pickle, _pickle, sys

def refuse(*args, **kwargs):
    raise AssertionError("something tried to unpickle")

class Refused(pickle.Unpickler):  # a subclass, so that dill (imported by torch) still imports
    def __init__(self, *args, **kwargs):
        refuse()

    def load(self):
        refuse()

for module in (pickle, _pickle):
    module.loads = refuse
    module.load = refuse
    module.Unpickler = Refused
try:
    import torch
    torch.load = refuse
except ImportError:
    pass

import numpy as np
import tensorstore_cache as tsc
from tensorstore_cache import verify_store

store = tsc.open_store(sys.argv[1])
keys = [f"src/k{i:04d}.bin" for i in range(150)]
rows = store.rows(keys)
total = 0.0
for start in range(0, 150, 32):
    total += float(store.take(rows[start:start + 32]).sum())
total += sum(float(store[k].sum()) for k in keys[::10])
assert store.paths == keys and "src/k0003.bin" in store and len(store) == 150
store.verify()
assert verify_store(sys.argv[1]).ok
print("read", total)
"""


def test_opening_and_reading_never_unpickles(pristine: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", NO_PICKLE, str(pristine)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    want = sum(float(_vec(k).sum()) for k in _keys())
    want += sum(float(_vec(k).sum()) for k in _keys()[::10])
    assert proc.stdout.split() == ["read", repr(want)]


# -- the writer publishes only what readers accept ------------------------------------

def test_a_store_readers_would_refuse_is_never_published(tmp_path: Path) -> None:
    root = tmp_path / "s.tsc"
    with pytest.raises(tsc.BuildError) as info:
        tsc.build_store(_keys()[:5], root, loader=_vec, loader_id="x" * 5000, workers=1,
                        progress=False, identity="none")
    assert "loader_id must be a short string" in str(info.value)
    assert "nothing was published" in str(info.value)
    assert isinstance(info.value.__cause__, tsc.CorruptStoreError)
    assert [p.name for p in tmp_path.iterdir()] == []


def test_metadata_past_the_readers_cap_is_never_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorstore_cache import config

    monkeypatch.setattr(config, "MAX_GROUP_JSON", 1024)  # as if 100k sources were skipped
    with pytest.raises(tsc.BuildError, match="more than the 1024 allowed"):
        tsc.build_store(_keys(), tmp_path / "s.tsc", loader=_vec, loader_id="vec/1",
                        workers=1, progress=False, identity="none")
    assert [p.name for p in tmp_path.iterdir()] == []
