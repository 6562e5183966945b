"""Layer 2, format: keys, the group metadata, shards, hash side files, verification."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorstore_cache as tsc
from tensorstore_cache.errors import CorruptStoreError
from tensorstore_cache.format import hashes, keys, metadata, shard
from tensorstore_cache.format.metadata import GroupMetadata
from tensorstore_cache.format.verify import verify_segments
from tensorstore_cache.reader import view_of

from ..support.strategies import source_paths


def _vec(path: str) -> Any:
    return np.full(4, len(path), np.float32)


@pytest.fixture()
def store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "s.tsc"
    sources = tmp_path / "src"  # real files: the store is of the default identity kind (stat)
    sources.mkdir()
    for i in range(10):
        (sources / f"k{i}").write_bytes(b"x" * i)
    tsc.build_store([str(sources / f"k{i}") for i in range(10)], root, loader=_vec,
                    loader_id="vec/1", workers=1, progress=False).close()
    return root


# odd paths the bulk fast path must treat exactly like normalize_key
_ODD = ["a", "./a", "a/", "a//b", "a/./b", "a/../b", ".hidden", "a/.b", "/abs/x", "x\udcff",
        "é/ü", "..", ".", "a.b/c..d", "//a", "a/b/"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(source_paths(), st.sampled_from(_ODD)), max_size=20))
def test_bulk_encoding_is_key_by_key_encoding(paths: list[str]) -> None:
    got_keys, got_encoded = keys.encode_keys(paths)
    want = [keys.normalize_key(p) for p in paths]
    assert [str(k) for k in got_keys] == want
    assert got_encoded == [keys.encode_key(k) for k in want]
    laid_keys, laid_encoded, layout = keys.encode_keys_laid_out(paths)
    assert [str(k) for k in laid_keys] == want and laid_encoded == got_encoded
    spans = zip(layout.starts.tolist(), layout.lengths.tolist(), strict=True)
    assert [layout.joined[a : a + n] for a, n in spans] == got_encoded


def test_bulk_encoding_of_paths_and_bad_values() -> None:
    assert keys.encode_keys([Path("a//b"), "c"]) == (["a/b", "c"], [b"a/b", b"c"])
    assert keys.encode_keys(np.array(["x/y", "z"], dtype=object))[1] == [b"x/y", b"z"]
    with pytest.raises(ValueError, match="NUL"):
        keys.encode_keys(["ok", "a\x00b"])
    with pytest.raises(ValueError, match="empty"):
        keys.encode_keys(["ok", ""])
    with pytest.raises(TypeError, match=r"str or os\.PathLike"):
        keys.encode_keys(["ok", 3])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(source_paths(), st.sampled_from(_ODD)), max_size=20))
def test_bulk_normalising_is_key_by_key_normalising(paths: list[str]) -> None:
    got = keys.normalize_keys(paths)
    assert got == [keys.normalize_key(p) for p in paths]
    assert all(type(k) is str for k in got)


def test_bulk_normalising_of_arrays_series_and_bad_values() -> None:
    pd = pytest.importorskip("pandas")
    want = ["a/b", "c/d.jpg"]
    for values in (np.array(["a/b", "c/d.jpg"]), np.array(["a//b", "c/./d.jpg"], dtype=object),
                   pd.Series(["a/b", "c/d.jpg"]), pd.Series(["a/b", "c/d.jpg"], dtype=object),
                   pd.Series(["a/b/", "./c/d.jpg"], dtype="string"), (Path("a/b"), "c/d.jpg")):
        got = keys.normalize_keys(values)
        assert got == want and all(type(k) is str for k in got), values
    with pytest.raises(ValueError, match="NUL"):  # a NUL must not pass as a separator
        keys.normalize_keys(["ok", "a\x00b"])
    with pytest.raises(ValueError, match="empty"):
        keys.normalize_keys(["ok", ""])
    with pytest.raises(TypeError, match=r"str or os\.PathLike"):
        keys.normalize_keys(pd.Series(["ok", None], dtype="string"))


def test_group_metadata_reads_what_it_writes_byte_for_byte(store_dir: Path, tmp_path: Path) -> None:
    meta = GroupMetadata.read(store_dir)
    on_disk = (store_dir / metadata.GROUP).read_bytes()
    assert json.loads(on_disk) == meta.to_json()
    attrs = meta.to_json()["attributes"][metadata.ATTR_KEY]
    assert list(attrs) == [  # the order of the on-disk document, format version 1
        "format_version", "n", "item_shape", "dtype", "loader_id", "loader_params",
        "rows_per_shard", "skipped", "created_unix", "key_bytes_len", "key_hash", "checksum",
        "files",
    ]
    again = tmp_path / "again"
    again.mkdir()
    meta.write(again)
    assert (again / metadata.GROUP).read_bytes() == on_disk
    assert GroupMetadata.from_json(json.loads(on_disk), "x") == meta
    assert set(meta.files) == metadata.expected_files(meta.spec, meta.key_bytes_len)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"zarr_format": 2, "node_type": "group"}, "not a zarr v3 group"),
        ({"zarr_format": 3, "node_type": "group", "attributes": {}}, "not a tensorstore_cache store"),
        ([], "not a zarr v3 group"),
    ],
)
def test_group_metadata_refuses_other_documents(doc: Any, match: str) -> None:
    with pytest.raises(CorruptStoreError, match=match):
        GroupMetadata.from_json(doc, "x/zarr.json")


def test_group_metadata_size_cap_is_read_from_config(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorstore_cache import config

    monkeypatch.setattr(config, "MAX_GROUP_JSON", 100)
    with pytest.raises(CorruptStoreError, match="more than the 100 allowed"):
        GroupMetadata.read(store_dir)
    fd = os.open(store_dir, os.O_RDONLY)
    try:  # through a descriptor of the directory, as an open store reads it
        with pytest.raises(CorruptStoreError, match="more than the 100 allowed"):
            GroupMetadata.read(store_dir, fd)
    finally:
        os.close(fd)


def test_shard_written_then_opened(tmp_path: Path) -> None:
    block = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "0"
    size, _digest = shard.write_shard(path, block, 5)
    assert size == shard.shard_file_size(3, 5, 16) == path.stat().st_size
    fd, offsets = shard.open_shard(path, tmp_path, rows=3, rows_per_shard=5, item_nbytes=16,
                                   expected_size=size)
    try:
        mapped = shard.map_shard_fd(fd, rows=3, offsets=offsets, item_shape=(4,),
                                    dtype=np.dtype("<f4"))
    finally:
        os.close(fd)
    assert offsets is None and mapped.rows is not None and np.array_equal(mapped.rows, block)
    with pytest.raises(CorruptStoreError, match="bytes but the store recorded"):
        shard.open_shard(path, tmp_path, rows=3, rows_per_shard=5, item_nbytes=16,
                         expected_size=size + 1)


def test_hash_side_file(tmp_path: Path) -> None:
    part = tmp_path / "part"
    assert hashes.read_hashes(part, 3) is None
    hashes.write_hashes(part, np.array([1, 2, 2**64 - 1], np.uint64))
    assert hashes.hashes_path(part).name == "part" + hashes.HASH_SUFFIX
    assert hashes.read_hashes(part, 3).tolist() == [1, 2, 2**64 - 1]  # type: ignore[union-attr]
    with pytest.raises(CorruptStoreError, match="its part holds 4 entries"):
        hashes.read_hashes(part, 4)


def test_verify_segments_reports_every_segment(store_dir: Path) -> None:
    with tsc.open_store(store_dir) as store:
        seg = view_of(store).segments[0]
        assert verify_segments("both", [seg, seg]).files_checked == 2 * len(seg.files)
        shard_file = store_dir / metadata.shard_key(seg.spec, 0)
        data = bytearray(shard_file.read_bytes())
        data[0] ^= 1
        shard_file.write_bytes(bytes(data))
        report = verify_segments("both", [seg])
    assert [p.kind for p in report.problems] == ["checksum"]
