"""Layer 5, writer: the one shard-writing path, rewriting rows, options built by keyword."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.format.metadata import VECTORS, GroupMetadata
from tensorstore_cache.format.spec import StoreSpec
from tensorstore_cache.fs import crash, durable
from tensorstore_cache.loaders import resolve_loader
from tensorstore_cache.reader.assembly import open_directory
from tensorstore_cache.writer.assemble import finish_store, publish, rewrite_rows, write_shard_file
from tensorstore_cache.writer.builder import build
from tensorstore_cache.writer.layout import rows_per_shard
from tensorstore_cache.writer.options import BuildOptions
from tensorstore_cache.writer.tasks import ShardTask

from ..support._loaders import Filled

_vec = Filled((4,))


def test_a_shard_file_is_written_and_flushed_one_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    block = np.ones((3, 4), np.float32)
    with pytest.raises(FileNotFoundError):  # vectors/ is never recreated (an abandoned build)
        write_shard_file(root, "vectors/c/0/0", block, 4)
    (root / VECTORS).mkdir(parents=True)
    monkeypatch.setattr(crash, "_KILL_AT", -1)  # count the I/O steps only
    monkeypatch.setattr(crash, "_io_trace", [])
    size, digest = write_shard_file(root, "vectors/c/0/0", block, 4)
    assert crash._io_trace == [
        "mkdir", "mkdir",  # vectors/c, vectors/c/0
        "create", "write", "write", "rename",  # the file, by a temporary file
    ]  # no sync yet: the whole store is synced at once before it is published (seal)
    assert (size, digest) == durable.file_digest(root / "vectors/c/0/0")


def test_rewrite_rows_then_finish_and_publish_makes_a_readable_store(tmp_path: Path) -> None:
    spec = StoreSpec(n=10, item_shape=(4,), dtype="float32", loader_id="vec/1",
                     loader_params={}, rows_per_shard=3)
    tmp = tmp_path / ".tmp"
    (tmp / VECTORS).mkdir(parents=True)
    source = np.arange(40, dtype=np.float32).reshape(10, 4)
    asked: list[list[int]] = []

    def read(rows: np.ndarray) -> np.ndarray:
        asked.append(rows.tolist())
        block: np.ndarray = source[rows]
        return block

    files = rewrite_rows(tmp, spec.layouts()[0], read)
    assert asked == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    keys = [f"k{i}" for i in range(10)]
    minus = np.full(10, -1, np.int64)
    meta = finish_store(tmp, spec, files, keys=keys, sizes=minus, mtimes=minus)
    publish(tmp, tmp_path / "s.tsc", meta, overwrite=False)
    assert GroupMetadata.read(tmp_path / "s.tsc") == meta
    with open_directory(tmp_path / "s.tsc") as store:
        np.testing.assert_array_equal(store.take(np.arange(10)), source)
        assert store.paths == keys
        store.verify()


@pytest.mark.parametrize("records", [False, True])
def test_a_store_is_on_disk_whole_before_its_group_metadata_and_its_publication(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: bool
) -> None:
    """Its files are written without a sync each; then every file and directory of the build
    directory is synced (one fsync_tree), then the group zarr.json is written (and synced)
    and the directory renamed into place."""
    from tensorstore_cache.writer import assemble

    synced: list[tuple[int, int]] = []
    real_fsync, real_write = os.fsync, GroupMetadata.write
    real_tree = durable.fsync_tree
    unsynced_at_seal: list[Path] = []

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_dev, st.st_ino))
        real_fsync(fd)

    def tree(root: Path) -> None:
        assert synced == [], "a file was synced on its own"
        real_tree(root)
        done = set(synced)
        unsynced_at_seal.extend(p for p in [root, *root.rglob("*")]
                                if (p.stat().st_dev, p.stat().st_ino) not in done)

    def write(meta: GroupMetadata, root: Path, **kwargs: object) -> None:
        assert not (root / "zarr.json").exists() and synced, "the group metadata came first"
        real_write(meta, root, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(assemble, "fsync_tree", tree)
    monkeypatch.setattr(GroupMetadata, "write", write)
    out = tmp_path / "s.tsc"
    keys = [f"k{i}" for i in range(10)]
    if records:
        fields: dict[str, tsc.Fixed | tsc.Ragged] = {"v": tsc.Fixed((4,), "float32"),
                                                      "ids": tsc.Ragged("int32")}
        tsc.build_store(keys, out, loader=_record, loader_id="rec/1", fields=fields, workers=1,
                        progress=False, identity="none").close()
    else:
        tsc.build_store(keys, out, loader=_vec, loader_id="vec/1", workers=1, progress=False,
                        identity="none", shard_bytes=64).close()
    assert unsynced_at_seal == []
    published = {(p.stat().st_dev, p.stat().st_ino) for p in [out, *out.rglob("*")]}
    assert published <= set(synced)  # every entry of the store, its zarr.json included


def _record(key: str) -> dict[str, np.ndarray]:
    n = int(key[1:])
    return {"v": np.full(4, n, np.float32), "ids": np.arange(n % 5, dtype=np.int32)}


def test_options_are_built_by_keyword() -> None:
    info = resolve_loader(_vec, loader_id="vec/1")
    with pytest.raises(TypeError):
        BuildOptions(info)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ShardTask("root", "vectors/c/0", [], _vec, "float32", (4,), 1, False)  # type: ignore[call-arg]
    assert BuildOptions(loader=info, workers=1).on_error == "raise"


def test_build_publishes_nothing_when_a_source_fails(tmp_path: Path) -> None:
    options = BuildOptions(loader=resolve_loader(_vec, loader_id="vec/1"), workers=1,
                           progress=False, identity="none")
    with pytest.raises(tsc.BuildError, match="1 of 3 sources could not be loaded") as info:
        build(["k1", "bad", "k2"], tmp_path / "s.tsc", options)
    assert info.value.failures[0][0] == "bad"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("n", "workers", "expected"), [
    (0, 1, 1), (10, 2, 10), (4_000, 2, 125), (4_096, 2, 512), (10_000, 2, 512), (8_000, 4, 125),
    (100_000, 2, 2560),
])
def test_rows_per_shard(n: int, workers: int, expected: int) -> None:
    """Covers of 12 KiB: shards of whole huge pages (512 rows, 6 MiB) once each process gets
    four of them, under the 32 MiB cap (2,730 rows: 2,560); about 16 shards each below."""
    assert rows_per_shard(n, 3 * 32 * 32 * 4, workers) == expected
