"""Stores at fsspec URLs: node-local copies made once, verified, atomically; uploads.

Filesystems used: ``memory://`` (in this process), ``local://`` and a counting
local filesystem (URLs that take the download path over local files, shared
by several processes), and a real S3 API served by moto on 127.0.0.1 (skipped
when ``moto[server]`` or ``s3fs`` is missing).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.common.s3server import S3Process
from tensorstore_cache.format.metadata import GroupMetadata
from tensorstore_cache.fs.durable import file_digest

from ..conftest import write_images

fsspec = pytest.importorskip("fsspec")
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

COUNT_LOG = "TSC_TEST_COUNT_LOG"
KILL_AT = "TSC_TEST_REMOTE_KILL_ON"


class CountingFS(LocalFileSystem):  # type: ignore[misc]
    """The local filesystem under ``countfs://``, logging every read to ``$TSC_TEST_COUNT_LOG``."""

    protocol = "countfs"

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        text = str(path)  # fsspec 2024.2 strips only file:// and local:// of a local path
        return super()._strip_protocol(text.removeprefix("countfs://"))

    def _log(self, what: str, path: str) -> None:
        log = os.environ.get(COUNT_LOG)
        if log:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, f"{os.getpid()} {what} {path}\n".encode())
            finally:
                os.close(fd)

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kw: Any) -> Any:
        self._log("cat", path)
        if path.endswith(os.environ.get(KILL_AT, "\0")):  # dies mid-download of a shard
            os.kill(os.getpid(), signal.SIGKILL)
        return super().cat_file(path, start, end, **kw)

    def get_file(self, rpath: str, lpath: str, **kw: Any) -> Any:
        self._log("get", rpath)
        if os.environ.get(COUNT_LOG):
            time.sleep(0.02)  # a slower "network": other processes arrive mid-download
        if rpath.endswith(os.environ.get(KILL_AT, "\0")):
            super().get_file(rpath, lpath, **kw)
            with open(lpath, "r+b") as f:  # and a torn last file
                f.truncate(max(0, os.path.getsize(lpath) // 2))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().get_file(rpath, lpath, **kw)


fsspec.register_implementation("countfs", CountingFS, clobber=True)


def _log_lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def _everything(store: tsc.CacheStore) -> np.ndarray:
    return np.asarray(store.take(np.arange(len(store))))


def _versions(cache: Path) -> list[Path]:
    """Published local copies under a cache directory."""
    return sorted(p for p in (cache / "remote").glob("*/*") if p.is_dir() and not p.name.startswith("."))


def _hidden(cache: Path) -> list[Path]:
    """Temporary download or staging directories left under a cache directory."""
    return sorted(p for p in (cache / "remote").glob("*/.*") if p.is_dir())


@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    return write_images(tmp_path / "images", 90, seed=7, gray_every=8)


@pytest.fixture
def local_store(images: list[str], tmp_path: Path) -> tsc.CacheStore:
    return tsc.build_store(images, tmp_path / "local.tsc", workers=1, progress=False)


def test_build_into_memory_url_then_open_on_a_fresh_node(
    images: list[str], local_store: tsc.CacheStore, tmp_path: Path
) -> None:
    url = f"memory://{tmp_path.name}/covers.tsc"
    built = tsc.build_store(images, url, workers=2, progress=False, cache_dir=tmp_path / "a")
    # memory:// is this process's only: the builder writes the shards too, and keeps its build
    assert Path(built.location).parent.parent == tmp_path / "a" / "remote"
    np.testing.assert_array_equal(_everything(built), _everything(local_store))
    mem = fsspec.filesystem("memory")
    files = GroupMetadata.read(Path(local_store.location)).files
    remote = {p.split("/covers.tsc/", 1)[1] for p in mem.find(f"/{tmp_path.name}/covers.tsc")}
    assert remote == set(files) | {"zarr.json"}
    # another node: an empty cache directory, so the store is downloaded and checked
    with tsc.open_store(url, cache_dir=tmp_path / "b") as other:
        assert Path(other.location).parent.parent == tmp_path / "b" / "remote"
        assert other.paths == local_store.paths
        np.testing.assert_array_equal(_everything(other), _everything(local_store))
        np.testing.assert_array_equal(other[images[3]], local_store[images[3]])
        other.verify()
    assert _hidden(tmp_path / "a") == [] and _hidden(tmp_path / "b") == []


def test_local_url_takes_the_copy_path_file_url_does_not(
    local_store: tsc.CacheStore, tmp_path: Path
) -> None:
    src = Path(local_store.location)
    cache = tmp_path / "cache"
    copy = tsc.open_store(f"local://{src}", cache_dir=cache)
    assert Path(copy.location).is_relative_to(cache) and _versions(cache) == [Path(copy.location)]
    np.testing.assert_array_equal(_everything(copy), _everything(local_store))
    files = GroupMetadata.read(src).files
    for rel, (size, digest) in files.items():
        assert file_digest(Path(copy.location) / rel) == (size, digest)
    direct = tsc.open_store(f"file://{src}", cache_dir=cache)
    assert direct.location == str(src) and len(_versions(cache)) == 1


def test_changed_remote_store_gets_a_new_copy(images: list[str], tmp_path: Path) -> None:
    url = f"memory://{tmp_path.name}/s.tsc"
    cache = tmp_path / "cache"
    tsc.build_store(images[:40], url, workers=1, progress=False, cache_dir=tmp_path / "builder")
    old = tsc.open_store(url, cache_dir=cache)
    assert len(old) == 40
    before = _everything(old)  # its shards are fetched now
    again = tsc.open_store(url, cache_dir=cache)
    assert again.location == old.location  # same version: the same copy, nothing downloaded
    elsewhere = tsc.open_store(url, cache_dir=tmp_path / "other")  # index only, no shard yet
    with pytest.raises(tsc.StoreExistsError):
        tsc.build_store(images, url, workers=1, progress=False, cache_dir=tmp_path / "builder")
    tsc.build_store(
        images[30:], url, workers=1, progress=False, cache_dir=tmp_path / "builder", overwrite=True
    )
    new = tsc.open_store(url, cache_dir=cache)
    assert new.location != old.location and len(_versions(cache)) == 2
    assert len(new) == 60 and images[0] not in new and images[0] in old
    np.testing.assert_array_equal(new[images[35]], old[images[35]])
    np.testing.assert_array_equal(_everything(old), before)  # fetched shards keep working
    # a shard of the old version this node never fetched: a clear error, never wrong data
    with pytest.raises(tsc.StoreReplacedError, match="was replaced after this process opened"):
        elsewhere[images[0]]
    # the overwrite removed the old store's files that the new one does not have
    mem = fsspec.filesystem("memory")
    files = GroupMetadata.read(Path(new.location)).files
    remote = {p.split("/s.tsc/", 1)[1] for p in mem.find(f"/{tmp_path.name}/s.tsc")}
    assert remote == set(files) | {"zarr.json"}


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_remote_store_is_never_published(
    local_store: tsc.CacheStore, tmp_path: Path, damage: str
) -> None:
    src = tmp_path / "remote.tsc"
    shutil.copytree(local_store.location, src)
    shard = src / "vectors" / "c" / "1" / "0" / "0" / "0"  # the second shard
    assert shard.is_file()
    raw = bytearray(shard.read_bytes())
    if damage == "flip":
        raw[100] ^= 0xFF
        shard.write_bytes(raw)
    elif damage == "truncate":
        shard.write_bytes(raw[:-10])
    else:
        shard.unlink()
    cache = tmp_path / "cache"
    store = tsc.open_store(f"local://{src}", cache_dir=cache)  # the index only: it is sound
    np.testing.assert_array_equal(store.take([0]), local_store.take([0]))  # shard 0 is sound
    with pytest.raises(tsc.CorruptStoreError) as info:
        store.take([store.spec.rows_per_shard])  # a row of the damaged shard
    assert info.value.path == f"local://{shard}"  # names the remote object
    assert not isinstance(info.value, tsc.StoreReplacedError)  # the store did not change
    assert "damaged" in str(info.value)
    (version,) = _versions(cache)
    rel = shard.relative_to(src)
    assert not (version / rel).exists() and (version / "vectors/c/0/0/0/0").is_file()
    assert [p.name for p in version.parent.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(tsc.CorruptStoreError):  # and again: nothing was kept
        store.take([store.spec.rows_per_shard])


def test_damaged_remote_index_is_never_published(
    local_store: tsc.CacheStore, tmp_path: Path
) -> None:
    src = tmp_path / "remote.tsc"
    shutil.copytree(local_store.location, src)
    index = src / "key_hash" / "c" / "0"
    raw = bytearray(index.read_bytes())
    raw[3] ^= 0xFF
    index.write_bytes(raw)
    cache = tmp_path / "cache"
    with pytest.raises(tsc.CorruptStoreError) as info:
        tsc.open_store(f"local://{src}", cache_dir=cache)
    assert "key_hash/c/0" in str(info.value)
    assert _versions(cache) == [] and _hidden(cache) == []


def test_remote_metadata_that_lies_is_refused(local_store: tsc.CacheStore, tmp_path: Path) -> None:
    src = tmp_path / "remote.tsc"
    shutil.copytree(local_store.location, src)
    meta = src / "vectors" / "zarr.json"
    meta.write_text(meta.read_text().replace('"float32"', '"float64"'))
    cache = tmp_path / "cache"
    with pytest.raises(tsc.CorruptStoreError) as info:
        tsc.open_store(f"local://{src}", cache_dir=cache)
    assert "vectors/zarr.json" in str(info.value)
    assert _versions(cache) == [] and _hidden(cache) == []


def test_missing_remote_store(tmp_path: Path) -> None:
    with pytest.raises(tsc.StoreNotFoundError) as info:
        tsc.open_store(f"memory://{tmp_path.name}/nothing.tsc", cache_dir=tmp_path)
    assert "nothing.tsc" in str(info.value)
    with pytest.raises(FileNotFoundError):
        tsc.open_store(f"local://{tmp_path}/nothing.tsc", cache_dir=tmp_path)


def _open_in_child(url: str, cache: str, barrier: Any) -> tuple[str, float]:
    barrier.wait()
    with tsc.open_store(url, cache_dir=cache) as store:
        return store.location, float(_everything(store).sum(dtype=np.float64))


def test_concurrent_first_opens_download_once(
    local_store: tsc.CacheStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "reads.log"
    monkeypatch.setenv(COUNT_LOG, str(log))
    url = f"countfs://{local_store.location}"
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(4)
    with ctx.Pool(4) as pool:
        results = pool.starmap(_open_in_child, [(url, str(cache), barrier)] * 4)
    locations = {loc for loc, _ in results}
    assert len(locations) == 1 and _versions(cache) == [Path(locations.pop())]
    expected = float(_everything(local_store).sum(dtype=np.float64))
    assert all(total == expected for _, total in results)
    lines = _log_lines(log)
    files = GroupMetadata.read(Path(local_store.location)).files
    gets = [path for _pid, what, path in lines if what == "get"]
    shards = sorted(f"{local_store.location}/{rel}" for rel in files if rel.startswith("vectors/c/"))
    assert len(shards) >= 2
    # the metadata and index downloaded exactly once, by one process
    assert sorted(gets) == sorted(
        f"{local_store.location}/{rel}" for rel in files if not rel.startswith("vectors/c/")
    )
    assert len({pid for pid, what, _ in lines if what == "get"}) == 1
    # each process read the small group zarr.json (to learn the version); every shard was
    # downloaded once on the node, whoever asked first (the others waited and mapped it)
    cats = [path for _pid, what, path in lines if what == "cat"]
    group = f"{local_store.location}/zarr.json"
    assert cats.count(group) == 4
    assert sorted(p for p in cats if p != group) == shards
    assert _hidden(cache) == []


def _read_all_quietly(url: str, cache: str) -> None:
    _everything(tsc.open_store(url, cache_dir=cache))


@pytest.mark.parametrize("victim", ["key_hash/c/0", "vectors/c/1/0/0/0"])
def test_download_killed_midway_leaves_nothing_usable_and_is_redone(
    local_store: tsc.CacheStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: str
) -> None:
    url = f"countfs://{local_store.location}"
    cache = tmp_path / "cache"
    monkeypatch.setenv(KILL_AT, f"/{victim}")  # SIGKILL while downloading an index file or a shard
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_read_all_quietly, args=(url, str(cache)))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    if victim.startswith("vectors"):
        (version,) = _versions(cache)  # the index was published; the shard was not
        assert not (version / victim).exists()  # no partial shard under its name, ever
        debris = [p.name for p in version.parent.iterdir() if p.name.startswith(".")]
        assert any(n.startswith(f".{version.name}-1.tsc-fetch-") for n in debris)  # hidden partial
    else:
        assert _versions(cache) == [] and len(_hidden(cache)) == 1  # its download directory
    monkeypatch.delenv(KILL_AT)
    store = tsc.open_store(url, cache_dir=cache)  # the locks died with it; the debris goes
    np.testing.assert_array_equal(_everything(store), _everything(local_store))
    assert _versions(cache) == [Path(store.location)]
    assert [p for p in Path(store.location).parent.iterdir() if p.name.startswith(".")] == []
    store.verify()


def _load_pickled(blob: bytes) -> tuple[str, float]:
    store = pickle.loads(blob)
    return store.location, float(_everything(store).sum(dtype=np.float64))


def test_pickled_remote_store_reopens_the_local_copy_without_requests(
    local_store: tsc.CacheStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "reads.log"
    url = f"countfs://{local_store.location}"
    store = tsc.open_store(url, cache_dir=tmp_path / "cache")
    _everything(store)  # every shard is on this node now
    blob = pickle.dumps(store)
    monkeypatch.setenv(COUNT_LOG, str(log))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        location, total = pool.apply(_load_pickled, (blob,))
    assert location == store.location
    assert total == float(_everything(local_store).sum(dtype=np.float64))
    assert _log_lines(log) == []  # the node's copy is immutable: no request to re-open it
    shutil.rmtree(tmp_path / "cache")  # a node without the copy goes back to the URL
    again = pickle.loads(blob)
    assert Path(again.location).is_dir() and len(again) == len(local_store)
    assert [what for _pid, what, _ in _log_lines(log)].count("cat") == 1


# -- a real S3 API on the loopback interface ---------------------------------------------


def test_s3_build_upload_open_elsewhere_and_overwrite(
    s3: S3Process, images: list[str], local_store: tsc.CacheStore, tmp_path: Path
) -> None:
    import s3fs

    s3.create_bucket("covers-bucket")
    options = s3.storage_options()
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    url = "s3://covers-bucket/v1/covers.tsc"
    built = tsc.build_store(
        images, url, workers=2, progress=False, cache_dir=tmp_path / "builder",
        storage_options=options,
    )
    np.testing.assert_array_equal(_everything(built), _everything(local_store))
    files = GroupMetadata.read(Path(local_store.location)).files
    listed = {p.split("/covers.tsc/", 1)[1] for p in fs.find("covers-bucket/v1/covers.tsc")}
    assert listed == set(files) | {"zarr.json"}
    reader = tsc.open_store(url, cache_dir=tmp_path / "reader", storage_options=options)
    assert Path(reader.location).is_relative_to(tmp_path / "reader")
    np.testing.assert_array_equal(_everything(reader), _everything(local_store))
    reader.verify()
    # a new version replaces the old one; a reader opening afterwards gets a new copy
    tsc.build_store(
        images[:20], url, workers=1, progress=False, cache_dir=tmp_path / "builder",
        storage_options=options, overwrite=True,
    )
    newer = tsc.open_store(url, cache_dir=tmp_path / "reader", storage_options=options)
    assert len(newer) == 20 and newer.location != reader.location
    np.testing.assert_array_equal(newer[images[5]], local_store[images[5]])
    assert len(reader) == len(images)  # the old copy stays valid for whoever maps it
