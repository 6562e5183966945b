"""Layer 3, remote transport: URLs, the node cache's names, upload then fetch (no store handle)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.remote.fetch import fetch_store
from tensorstore_cache.remote.upload import check_target, staging_dir, upload_store
from tensorstore_cache.remote.urls import file_url_path, is_url, remote_cache_root, url_dir

from ..support._loaders import Filled

fsspec = pytest.importorskip("fsspec")


_vec = Filled((4,))


def test_urls_and_the_node_cache_names() -> None:
    assert is_url("s3://b/x") and is_url("simplecache::s3://b/x") and not is_url("a/b")
    assert not is_url(Path("s3://b"))
    assert file_url_path("file:///tmp/a%20b") == Path("/tmp/a b")
    assert file_url_path("s3://b/x") is None
    with pytest.raises(ValueError, match="names a file on host"):
        file_url_path("file://other/x")
    # the node cache's directory names are part of its layout: copies made before stay valid
    assert url_dir("s3://bucket/covers.tsc") == "covers.tsc-b81c4db5a59f07ed"
    assert url_dir("s3://bucket/covers.tsc/") == url_dir("s3://bucket/covers.tsc")
    assert remote_cache_root("/c") == Path("/c/remote")


def test_upload_then_fetch_the_same_files(tmp_path: Path) -> None:
    url = f"memory://tsc-{uuid.uuid4().hex}/s.tsc"
    cache = tmp_path / "cache"
    check_target(url, overwrite=False, storage_options=None)
    staging = staging_dir(url, cache)
    keys = [f"k{i}" for i in range(20)]
    tsc.build_store(keys, staging / "store", loader=_vec, loader_id="vec/1", workers=1,
                    progress=False, identity="none").close()
    upload_store(staging / "store", url, cache_dir=cache)
    with pytest.raises(tsc.StoreExistsError, match="already holds a store"):
        check_target(url, overwrite=False, storage_options=None)
    local = fetch_store(url, cache_dir=cache)
    assert not (staging / "store").exists(), "the uploaded store became this node's copy"
    assert local.parent == remote_cache_root(cache) / url_dir(url)
    assert tsc.verify_store(local).ok
    other = fetch_store(url, cache_dir=tmp_path / "other-node")  # a real download
    assert (other / "zarr.json").read_bytes() == (local / "zarr.json").read_bytes()
    assert (other / "key_hash/c/0").is_file()  # the index
    assert not list(other.glob("vectors/c/*/0/0/0"))  # shards: fetched when read
    with tsc.open_store(url, cache_dir=tmp_path / "other-node") as store:
        assert store.location == str(other)
        np.testing.assert_array_equal(store.stack(keys), np.stack([_vec(k) for k in keys]))
    assert tsc.verify_store(other).ok
