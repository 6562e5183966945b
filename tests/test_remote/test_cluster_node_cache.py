"""A cluster's namespace read through the node cache: bundles, shards when first read, the cap.

With ``cached(..., remote=...)`` a node holds no copy of a part's data: it fetches the part's
bundle (its metadata and index, one object) and then each shard the first time a process of
the node reads it, into ``<cache_dir>/remote/`` under the cache's cap and eviction, as
``open_store("s3://...")`` does. Against the test S3 server (moto in its own process, every
request counted), one builder node and fresh nodes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.common.s3server import S3Process
from tensorstore_cache.fs import disk_usage
from tensorstore_cache.reader import view_of

pytest.importorskip("s3fs")

REPO = Path(__file__).resolve().parents[2]
BUCKET = "nodecache"
PREFIX = f"s3://{BUCKET}/cluster"
N = 2_000


def cover(path: str) -> np.ndarray:
    """The vector of ``/covers/<i>.jpg``: random, reproducible, no decoding."""
    i = int(path.rsplit("/", 1)[1].split(".")[0])
    return np.random.default_rng(i).integers(0, 256, (3, 32, 32), dtype=np.uint8)


KEYS = [f"/covers/{i}.jpg" for i in range(N)]


def _cached(cache: Path, options: dict[str, Any], keys: list[str] = KEYS) -> tsc.CacheStore:
    return tsc.cached(keys, cache_dir=cache, remote=PREFIX, storage_options=options,
                      loader=cover, loader_id="test.cluster-cover/1", dtype="uint8",
                      identity="none", workers=1, progress=False)


def _expected(keys: list[str]) -> np.ndarray:
    return np.stack([cover(k) for k in keys])


@pytest.fixture(scope="module")
def built(s3: S3Process, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The namespace of N covers, built by one node: its rows per shard and part count."""
    options = s3.storage_options()
    with _cached(tmp_path_factory.mktemp("builder"), options) as store:
        rows = store.spec.rows_per_shard
        parts = len(view_of(store).segments)
    assert parts == 1 and rows < N // 4  # several shards
    return {"options": options, "rows": rows}


def _cache_bytes(cache: Path) -> int:
    """Bytes of the node cache's versions (bookkeeping files aside)."""
    total = 0
    for dirpath, _dirs, names in os.walk(cache / "remote"):
        for name in names:
            if name in ("usage", "limit.json", "evict.lock") or name.endswith(
                    (".holds", ".lock")) or "probes" in dirpath:
                continue
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _shard_files(cache: Path) -> list[Path]:
    return sorted((cache / "remote").glob("*/*/vectors/c/*/0/0/0"))


READ_PICKLED = """
import pickle, sys
store = pickle.loads(open(sys.argv[1], "rb").read())
print(store[sys.argv[2]].sum())
"""


def _read_in_fork(data: bytes, key: str, out: Any) -> None:
    out.put(int(pickle.loads(data)[key].sum()))


def test_a_fresh_node_fetches_one_bundle_then_only_the_shards_it_reads(
    built: dict[str, Any], s3: S3Process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh node's call makes 3 requests (the head hint, the absent next manifest, the
    part's bundle) and writes nothing; reading 3 rows of 3 shards fetches those 3 shards
    once; store.location is the node's namespace directory. Pickled, the store carries no
    credential: a forked process and a new one, given the credentials through their
    environment, each read it and fetch only the shard they read."""
    cache = tmp_path / "node"
    key_id, secret = "AKIDPICKLED", "pickled-secret-never-shown"
    options = {**built["options"], "key": key_id, "secret": secret}
    s3.reset()
    store = _cached(cache, options)
    opened = s3.log()
    assert [r.method for r in opened] == ["GET"] * 3, [(r.method, r.key) for r in opened]
    assert opened[-1].key.endswith(".bundle") and not _shard_files(cache)
    assert Path(store.location).parent == cache and (Path(store.location) / "remote.json").is_file()
    rows = built["rows"]
    picked = [KEYS[0], KEYS[2 * rows + 1], KEYS[4 * rows + 2]]
    np.testing.assert_array_equal(store.take(store.rows(picked)), _expected(picked))
    shards = [r for r in s3.log()[len(opened):] if r.method == "GET"]
    assert len(shards) == 3 and len({r.key for r in shards}) == 3
    assert all("/parts/" in r.key and "/vectors/c/" in r.key for r in shards)
    assert len(_shard_files(cache)) == 3
    data = pickle.dumps(store)
    assert key_id.encode() not in data and secret.encode() not in data
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)  # what the processes below inherit
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    before = len(s3.log())
    forked = multiprocessing.get_context("fork")
    out: Any = forked.Queue()
    child = forked.Process(target=_read_in_fork, args=(data, KEYS[5 * rows + 4], out))
    child.start()
    assert out.get(timeout=120) == int(cover(KEYS[5 * rows + 4]).sum())
    child.join(60)
    path = tmp_path / "store.pickle"
    path.write_bytes(data)
    other = KEYS[6 * rows + 3]
    proc = subprocess.run([sys.executable, "-c", READ_PICKLED, str(path), other], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) == int(cover(other).sum())
    after = s3.log()[before:]
    assert len(after) == 2 and all("/vectors/c/" in r.key for r in after), after
    store.close()


def test_the_cap_of_the_node_cache_holds_and_an_evicted_part_comes_back(
    built: dict[str, Any], s3: S3Process, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under $TSC_CACHE_MAX_BYTES of the index and 3 shards, a full pass over the namespace in
    batches returns every vector and the node cache stays under the cap; once the store is
    closed, gc can evict the whole part from the node cache, and the next call fetches its
    bundle again (nothing is computed)."""
    cache = tmp_path / "node"
    with _cached(cache, built["options"]) as first:
        index = _cache_bytes(cache)
        first.take(first.rows(KEYS[:1]))
        shard = _cache_bytes(cache) - index
    cap = index + 3 * shard
    monkeypatch.setenv("TSC_CACHE_MAX_BYTES", str(cap))
    with _cached(cache, built["options"]) as store:
        namespace = Path(store.location)
        for start in range(0, N, 128):
            batch = KEYS[start : start + 128]
            np.testing.assert_array_equal(store.take(store.rows(batch)), _expected(batch))
            assert _cache_bytes(cache) <= cap
        stats = store.fetch_stats
        assert stats is not None and stats.cap == cap
    monkeypatch.delenv("TSC_CACHE_MAX_BYTES")
    removed = tsc.gc(cache, max_bytes=disk_usage(namespace))  # the node cache's copies go
    kinds = {r.kind for r in removed}
    assert "remote-version" in kinds and kinds <= {"remote-version", "remote-shard"}, removed
    assert not _shard_files(cache) and (namespace / "remote.json").is_file()
    s3.reset()
    with _cached(cache, built["options"], KEYS[:10]) as again:
        np.testing.assert_array_equal(again.take(again.rows(KEYS[:10])), _expected(KEYS[:10]))
    gets = [r.key for r in s3.log() if r.method == "GET"]
    assert sum(k.endswith(".bundle") for k in gets) == 1
