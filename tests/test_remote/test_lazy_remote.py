"""Stores in object storage read shard by shard through a node cache.

Everything runs against a real S3 API (moto) served on 127.0.0.1 by another
process that counts every request it serves (``benchmarks.common.s3server``), so what
a reader fetched is counted on the server's side. The main store is 20,000
covers of random 3x32x32 uint8 vectors (a cheap loader, no image decoding)
with 256 KiB shards: 84 rows a shard (page-aligned), 239 shards.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.reader import view_of

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import contextlib
import gc

from benchmarks.common.s3server import S3Process

REPO = Path(__file__).resolve().parents[2]
N = 20_000
SHARD_BYTES = 256 << 10
ROWS = 84  # 256 KiB // 3,072 bytes a row = 85, rounded down to a multiple of 4 (whole pages)
SHARDS = -(-N // ROWS)
BUCKET = "covers"
URL = f"s3://{BUCKET}/big.tsc"
PREFIX = f"{BUCKET}/big.tsc/"


def cover(path: str) -> np.ndarray:
    """The vector of ``/covers/<i>.jpg``: random, reproducible, no decoding."""
    i = int(path.rsplit("/", 1)[1].split(".")[0])
    return np.random.default_rng(i).integers(0, 256, (3, 32, 32), dtype=np.uint8)


def key(i: int) -> str:
    return f"/covers/{i}.jpg"


def expected(rows: Any) -> np.ndarray:
    return np.stack([cover(key(int(r))) for r in rows])


def shard_obj(row: int, prefix: str = PREFIX) -> str:
    return f"{prefix}vectors/c/{row // ROWS}/0/0/0"


@pytest.fixture(scope="module")
def big(s3: S3Process, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 20,000-cover store, built and uploaded."""
    store = tsc.build_store(
        [key(i) for i in range(N)], URL, loader=cover, loader_id="test.cover/1", dtype="uint8",
        shard_bytes=SHARD_BYTES, workers=1, progress=False,
        cache_dir=tmp_path_factory.mktemp("builder"), storage_options=s3.storage_options(), identity="none",
    )
    assert store.spec.rows_per_shard == ROWS
    store.close()
    return {"options": s3.storage_options()}


def _run(code: str, *args: str, timeout: float = 120) -> Any:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


READ_FIVE = """
import json, sys
import tensorstore_cache as tsc
url, cache, options, keys = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
store = tsc.open_store(url, cache_dir=cache, storage_options=options)
print(json.dumps([store[k].tolist() for k in keys]))
"""


def test_a_fresh_process_reading_five_rows_fetches_the_index_and_five_shards(
    big: dict[str, Any], s3: S3Process, tmp_path: Path
) -> None:
    rows = [3, 4_000, 9_999, 15_000, 19_999]  # five different shards
    s3.reset()
    got = _run(READ_FIVE, URL, str(tmp_path / "cache"), json.dumps(big["options"]),
               json.dumps([key(r) for r in rows]))
    np.testing.assert_array_equal(np.array(got, dtype=np.uint8), expected(rows))
    gets = s3.requests("GET", PREFIX)
    shards = sorted(r.key for r in gets if "/vectors/c/" in r.key)
    assert shards == sorted(shard_obj(r) for r in rows)  # those five, once each
    rest = [r for r in gets if "/vectors/c/" not in r.key]
    assert len(rest) == len({r.key for r in rest})  # metadata and index: once each
    assert all(r.key.endswith(("zarr.json", "/c/0")) for r in rest)
    index = sum(r.sent for r in rest)
    # the version directory holds the metadata, the index and exactly those shards
    (version,) = [p for p in (tmp_path / "cache" / "remote").glob("*/*") if p.is_dir()]
    shard_files = list(version.glob("vectors/c/*/0/0/0"))
    assert len(shard_files) == 5
    here = sum(p.stat().st_size for p in version.rglob("*") if p.is_file())
    assert index == here - sum(p.stat().st_size for p in shard_files)  # bytes of the index
    assert index < 2 << 20  # bounded by the index (20,000 keys), not by the 61 MB of vectors
    assert sum(r.sent for r in gets) <= index + 5 * (SHARD_BYTES + 16 * ROWS + 4)


def test_take_fetches_the_missing_shards_of_a_batch_concurrently(
    big: dict[str, Any], s3: S3Process, tmp_path: Path
) -> None:
    store = tsc.open_store(URL, cache_dir=tmp_path / "cache", storage_options=big["options"])
    rows = np.array([ROWS * k + 1 for k in (10, 20, 30, 40, 50, 60)])
    s3.reset()
    s3.stall({f"vectors/c/{k}/0/0/0": (1000, 0.5) for k in (10, 20, 30, 40, 50, 60)})
    try:
        np.testing.assert_array_equal(store.take(rows), expected(rows))
    finally:
        s3.stall({})
    gets = [r for r in s3.requests("GET", PREFIX) if "/vectors/c/" in r.key]
    assert len(gets) == 6
    # the server served several of them at the same moment (a bounded pool of threads)
    overlap = max(sum(1 for o in gets if o.started < g.ended and g.started < o.ended) for g in gets)
    assert overlap >= 2
    assert store.fetch_stats is not None and store.fetch_stats.shards == 6
    # prefetch: the shards of given rows, then everything; nothing fetched twice
    assert store.prefetch(rows).result() == 0
    assert store.prefetch(np.array([ROWS * 70])).result() == 1
    done = store.prefetch(background=True)
    assert done.result(timeout=120) == SHARDS - 7
    assert len([r for r in s3.requests("GET", PREFIX) if "/vectors/c/" in r.key]) == SHARDS
    store.verify()


def _read_rows(url: str, cache: str, options: dict[str, Any], rows: list[int], barrier: Any) -> int:
    barrier.wait()
    with tsc.open_store(url, cache_dir=cache, storage_options=options) as store:
        return int(store.take(np.array(rows)).sum(dtype=np.int64))


def test_four_processes_reading_the_same_rows_download_each_shard_once(
    big: dict[str, Any], s3: S3Process, tmp_path: Path
) -> None:
    rows = list(range(0, N, N // 40))[:40]  # 40 rows in 40 shards
    s3.reset()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(4)
    with ctx.Pool(4) as pool:
        sums = pool.starmap(_read_rows, [(URL, str(tmp_path / "cache"), big["options"], rows,
                                          barrier)] * 4)
    assert sums == [int(expected(rows).sum(dtype=np.int64))] * 4
    gets = s3.requests("GET", PREFIX)
    shards = [r.key for r in gets if "/vectors/c/" in r.key]
    assert sorted(shards) == sorted({shard_obj(r) for r in rows})  # one download per shard
    assert len([r for r in gets if r.key.endswith("key_hash/c/0")]) == 1
    assert len([r for r in gets if r.key == f"{PREFIX}zarr.json"]) == 4  # each learns the version


KILLED_READER = """
import json, sys
import tensorstore_cache as tsc
url, cache, options, k = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
store = tsc.open_store(url, cache_dir=cache, storage_options=options)
store[k]
"""


def test_sigkill_mid_download_leaves_no_shard_and_the_next_read_completes_it(
    big: dict[str, Any], s3: S3Process, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    row = 8_500
    shard = f"vectors/c/{row // ROWS}/0/0/0"
    s3.stall({shard: (SHARD_BYTES // 2, 30.0)})  # half the bytes, then the "network" hangs
    proc = subprocess.Popen([sys.executable, "-c", KILLED_READER, URL, str(cache),
                             json.dumps(big["options"]), key(row)], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if list(cache.glob(f"remote/*/.*-{row // ROWS}.tsc-fetch-*")):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the download never started")
        time.sleep(0.3)  # well into the transfer
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        s3.stall({})
        proc.kill()
        proc.wait()
    assert not list(cache.glob(f"remote/*/*/{shard}"))  # nothing at the shard's name
    assert list(cache.glob(f"remote/*/.*-{row // ROWS}.tsc-fetch-*"))  # its hidden partial
    with tsc.open_store(URL, cache_dir=cache, storage_options=big["options"]) as store:
        np.testing.assert_array_equal(store[key(row)], cover(key(row)))  # the lock died with it
        assert len(list(cache.glob(f"remote/*/*/{shard}"))) == 1
    assert not list(cache.glob("remote/*/.*.tsc-fetch-*"))  # the dead download's file is gone


class Small(NamedTuple):
    """A small store's address, options and layout (its shard length is the build's choice)."""

    url: str
    options: dict[str, Any]
    rows: int  # rows per shard
    shards: int


@pytest.fixture
def small(s3: S3Process, tmp_path: Path) -> Small:
    """A 1,000-cover store of its own (a dozen shards or more), for tests that damage or replace it."""
    url = f"s3://{BUCKET}/{tmp_path.name}.tsc"
    store = tsc.build_store([key(i) for i in range(1_000)], url, loader=cover, loader_id="test.cover/1",
                            dtype="uint8", shard_bytes=SHARD_BYTES, workers=1, progress=False,
                            cache_dir=tmp_path / "builder", storage_options=s3.storage_options(),
                            identity="none")
    rows = store.spec.rows_per_shard
    store.close()
    assert 1_000 // rows > 6  # the tests below read shards 4 and 5 and keep shard 0
    return Small(url, s3.storage_options(), rows, -(-1_000 // rows))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_bad_object_names_its_url_and_nothing_is_kept(
    small: Small, tmp_path: Path, damage: str
) -> None:
    import s3fs

    url, options, rows = small.url, small.options, small.rows
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    obj = f"{url[5:]}/vectors/c/4/0/0/0"
    raw = bytearray(fs.cat_file(obj))
    if damage == "flip":
        raw[1000] ^= 0xFF
        fs.pipe_file(obj, bytes(raw))
    elif damage == "truncate":
        fs.pipe_file(obj, bytes(raw[:-100]))
    else:
        fs.rm_file(obj)
    cache = tmp_path / "cache"
    store = tsc.open_store(url, cache_dir=cache, storage_options=options)
    np.testing.assert_array_equal(store[key(3)], cover(key(3)))  # other shards are fine
    with pytest.raises(tsc.CorruptStoreError) as info:
        store[key(4 * rows)]
    assert info.value.path == f"{url}/vectors/c/4/0/0/0"
    assert f"{url}/vectors/c/4/0/0/0" in str(info.value)
    assert not isinstance(info.value, tsc.StoreReplacedError)
    assert not list(cache.glob("remote/*/*/vectors/c/4/0/0/0"))
    assert not list(cache.glob("remote/*/.*.tsc-fetch-*"))


def test_a_replaced_store_keeps_serving_the_old_version_or_says_reopen(
    small: Small, tmp_path: Path
) -> None:
    url, options, rows = small.url, small.options, small.rows
    cache = tmp_path / "cache"
    old = tsc.open_store(url, cache_dir=cache, storage_options=options)
    np.testing.assert_array_equal(old[key(1)], cover(key(1)))  # shard 0 is now local

    def inverted(path: str) -> np.ndarray:
        return 255 - cover(path)

    tsc.build_store([key(i) for i in range(1_000)], url, loader=inverted, loader_id="test.inv/1",
                    dtype="uint8", shard_bytes=SHARD_BYTES, workers=1, progress=False,
                    overwrite=True, cache_dir=tmp_path / "builder2",
                    storage_options=options, identity="none").close()
    np.testing.assert_array_equal(old[key(2)], cover(key(2)))  # the old version, still
    with pytest.raises(tsc.StoreReplacedError, match=r"replaced.*reopen"):
        old[key(5 * rows)]  # shard 5 was never fetched: its bytes are the new version's now
    new = tsc.open_store(url, cache_dir=cache, storage_options=options)
    np.testing.assert_array_equal(new[key(5 * rows)], 255 - cover(key(5 * rows)))
    np.testing.assert_array_equal(new[key(1)], 255 - cover(key(1)))
    assert new.location != old.location


# -- network filesystems --------------------------------------------------------------------


def _mapped_files() -> set[str]:
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                out.add(parts[5].strip())
    return out


@pytest.fixture
def nfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path/nfs`` as the mount table of an NFS client shows it (the rest stays local)."""
    from tensorstore_cache.fs import mounts

    mnt = tmp_path / "nfs"
    mnt.mkdir()
    real = Path("/proc/self/mountinfo").read_text()
    table = tmp_path / "mountinfo"
    table.write_text(real + f"999 1 0:99 / {mnt} rw,relatime - nfs4 filer:/export rw,vers=4.2\n")
    monkeypatch.setattr(mounts, "MOUNTINFO", str(table))
    local = mounts.statfs_type

    def statfs(path: str) -> int | None:  # what statfs says on an NFS client: NFS_SUPER_MAGIC
        return 0x6969 if Path(path).is_relative_to(mnt) else local(path)

    monkeypatch.setattr(mounts, "statfs_type", statfs)
    return mnt


def test_a_store_on_nfs_is_read_through_the_node_cache(nfs: Path, tmp_path: Path) -> None:
    tsc.build_store([key(i) for i in range(500)], nfs / "covers.tsc", loader=cover,
                    loader_id="test.cover/1", dtype="uint8", shard_bytes=SHARD_BYTES, workers=1,
                    progress=False, identity="none").close()
    # the store the build returned keeps its index mapped until it is collected (close()
    # releases the data's mappings, not the index arrays it holds): not this test's subject
    gc.collect()
    cache = tmp_path / "cache"
    store = tsc.open_store(nfs / "covers.tsc", cache_dir=cache)
    assert Path(store.location).is_relative_to(cache / "remote")
    rows = np.array([0, 100, 499])
    np.testing.assert_array_equal(store.take(rows), expected(rows))
    mapped = _mapped_files()
    assert not [m for m in mapped if m.startswith(str(nfs))]  # nothing maps the network files
    assert [m for m in mapped if m.startswith(str(cache))]
    # the user's explicit choice: map it in place
    direct = tsc.open_store(nfs / "covers.tsc", local_copy="never")
    assert direct.location == str(nfs / "covers.tsc")
    np.testing.assert_array_equal(direct.take(rows), expected(rows))
    # local_copy="always": a local store through the node cache too
    local = tsc.build_store([key(i) for i in range(100)], tmp_path / "local.tsc", loader=cover,
                            loader_id="test.cover/1", dtype="uint8", workers=1, progress=False, identity="none")
    copied = tsc.open_store(local.location, cache_dir=cache, local_copy="always")
    assert Path(copied.location).is_relative_to(cache / "remote")
    np.testing.assert_array_equal(copied[key(5)], cover(key(5)))
    with pytest.raises(ValueError, match="local_copy"):
        tsc.open_store(local.location, local_copy="sometimes")  # type: ignore[arg-type]


def test_a_node_cache_on_nfs_is_warned_about_or_refused(
    nfs: Path, small: Small
) -> None:
    url, options = small.url, small.options
    with pytest.warns(tsc.CacheLimitWarning, match=r"nfs4 \(filer:/export.*local disk"):
        store = tsc.open_store(url, cache_dir=nfs / "cache", storage_options=options)
    np.testing.assert_array_equal(store[key(1)], cover(key(1)))
    with pytest.raises(ValueError, match=r"nfs4.*local disk"):
        tsc.open_store(url, cache_dir=nfs / "cache2", storage_options=options,
                       local_copy="always")
    with pytest.raises(ValueError, match="local_copy='never' cannot open"):
        tsc.open_store(url, cache_dir=nfs / "cache", storage_options=options, local_copy="never")


# -- threads and fork -----------------------------------------------------------------------


def test_fork_dataloader_workers_while_a_prefetch_thread_runs(
    big: dict[str, Any], tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    from tensorstore_cache.torch import StoreDataset

    store = tsc.open_store(URL, cache_dir=tmp_path / "cache", storage_options=big["options"],
                           prefetch=True)  # a background thread fetches every shard
    picked = range(0, 6_000, 3)
    ds = StoreDataset(store, [key(i) for i in picked])
    loader = ds.dataloader(128, num_workers=2, multiprocessing_context="fork")
    got = torch.cat(list(loader)).numpy()
    np.testing.assert_array_equal(got, expected(picked))
    store.prefetch().result(timeout=120)  # joins the background fetch's work; all local now
    (version,) = [p for p in (tmp_path / "cache" / "remote").glob("*/*") if p.is_dir()]
    assert len(list(version.glob("vectors/c/*/0/0/0"))) == SHARDS


# -- the cap --------------------------------------------------------------------------------


def _cache_bytes(cache: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(cache / "remote"):
        for name in names:
            if name in ("usage", "limit.json", "evict.lock") or name.endswith((".holds", ".lock")):
                continue  # bookkeeping, a few bytes
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _shard_size(options: dict[str, Any]) -> int:
    import s3fs

    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    return int(fs.size(f"{PREFIX}vectors/c/0/0/0/0"))


def test_the_cap_evicts_least_recently_used_shards_never_mapped_ones(
    big: dict[str, Any], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shard = _shard_size(big["options"])
    first = tsc.open_store(URL, cache_dir=cache, storage_options=big["options"])
    index = _cache_bytes(cache)
    cap = index + 10 * shard
    # one reader after another, each reading 8 shards and closing: the cap holds
    for start in range(0, 40, 8):
        with tsc.open_store(URL, cache_dir=cache, storage_options=big["options"],
                            max_bytes=cap) as store:
            rows = np.arange(start, start + 8) * ROWS
            np.testing.assert_array_equal(store.take(rows), expected(rows))
        assert _cache_bytes(cache) <= cap
    (version,) = [p for p in (cache / "remote").glob("*/*") if p.is_dir()]
    present = sorted(int(p.parts[-4]) for p in version.glob("vectors/c/*/0/0/0"))
    assert present and min(present) >= 24  # the least recently used went first
    # live readers map shards; once only mapped shards are left, the cache grows past the
    # cap rather than evict one of them, and says so once
    holders: list[tuple[tsc.CacheStore, np.ndarray]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for h in range(4):
            holder = tsc.open_store(URL, cache_dir=cache, storage_options=big["options"],
                                    max_bytes=cap)
            budget = view_of(holder).segments[0].vectors.budget
            assert budget is not None and 4 * budget > 10  # four of them map more than the cap
            rows = (100 + h * budget + np.arange(budget)) * ROWS
            np.testing.assert_array_equal(holder.take(rows), expected(rows))
            holders.append((holder, rows))
    over = [w for w in caught if issubclass(w.category, tsc.CacheLimitWarning)]
    assert len(over) == 1 and "over its cap" in str(over[0].message)
    assert _cache_bytes(cache) > cap
    for holder, rows in holders:  # never evicted while mapped
        for k in set((rows // ROWS).tolist()):
            assert (version / f"vectors/c/{k}/0/0/0").is_file()
        np.testing.assert_array_equal(holder.take(rows), expected(rows))
        holder.close()
    first.close()
    with tsc.open_store(URL, cache_dir=cache, storage_options=big["options"],
                        max_bytes=cap) as again:  # nothing mapped now: back under the cap
        again.take(np.arange(150, 152) * ROWS)
    assert _cache_bytes(cache) <= cap


def test_a_full_pass_under_a_cap_of_ten_shards_releases_what_it_no_longer_reads(
    big: dict[str, Any], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shard = _shard_size(big["options"])
    with tsc.open_store(URL, cache_dir=cache, storage_options=big["options"]):
        index = _cache_bytes(cache)  # metadata and index: fetched by this first open
    cap = index + 10 * shard
    store = tsc.open_store(URL, cache_dir=cache, storage_options=big["options"], max_bytes=cap)
    budget = view_of(store).segments[0].vectors.budget
    assert budget is not None and 1 <= budget < 10
    # an epoch in shuffled shard order (rows shuffled within groups of 4 shards), batches of 256
    rng = np.random.default_rng(0)
    order = np.concatenate([
        rng.permutation(np.arange(g * ROWS, min(N, (g + 4) * ROWS)))
        for g in rng.permutation(np.arange(0, SHARDS, 4))
    ])
    assert sorted(order.tolist()) == list(range(N))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for start in range(0, N, 256):
            rows = order[start : start + 256]
            np.testing.assert_array_equal(store.take(rows), expected(rows))
            assert _cache_bytes(cache) <= cap  # nothing else maps: the cap holds
            assert len(view_of(store).segments[0].supply.holds.held) <= budget  # type: ignore[union-attr]
        v = store[key(7)]
        assert v.base is None  # a copy: nothing the user holds points into a released shard
        np.testing.assert_array_equal(v, cover(key(7)))
        assert not [w for w in caught if issubclass(w.category, tsc.CacheLimitWarning)]
        # random batches: each spans more shards than the cap holds, so shards are fetched
        # again and again; said once, with the numbers
        for _ in range(3):
            rows = rng.integers(0, N, 64)
            np.testing.assert_array_equal(store.take(rows), expected(rows))
            assert _cache_bytes(cache) <= cap
    thrash = [w for w in caught if issubclass(w.category, tsc.CacheLimitWarning)]
    assert len(thrash) == 1 and "again after they were evicted" in str(thrash[0].message)
    stats = store.fetch_stats
    assert stats is not None and stats.refetched > 0 and stats.cap == cap
    assert stats.shards == SHARDS + stats.refetched  # the epoch fetched each shard once
    store.close()
    assert _cache_bytes(cache) <= cap


def test_the_smallest_cap_wins_and_is_recorded(
    small: Small, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, options = small.url, small.options
    cache = tmp_path / "cache"
    a = tsc.open_store(url, cache_dir=cache, storage_options=options, max_bytes=50 << 20)
    assert a.fetch_stats is not None and a.fetch_stats.cap == 50 << 20
    with pytest.warns(tsc.CacheLimitWarning, match="smallest cap wins"):
        b = tsc.open_store(url, cache_dir=cache, storage_options=options, max_bytes=80 << 20)
    assert b.fetch_stats is not None and b.fetch_stats.cap == 50 << 20
    c = tsc.open_store(url, cache_dir=cache, storage_options=options, max_bytes=20 << 20)
    assert c.fetch_stats is not None and c.fetch_stats.cap == 20 << 20
    d = tsc.open_store(url, cache_dir=cache, storage_options=options)  # no cap of its own
    assert d.fetch_stats is not None and d.fetch_stats.cap == 20 << 20
    assert json.loads((cache / "remote" / "limit.json").read_text())["max_bytes"] == 20 << 20
    monkeypatch.setenv("TSC_CACHE_MAX_BYTES", str(10 << 20))
    e = tsc.open_store(url, cache_dir=cache, storage_options=options)
    assert e.fetch_stats is not None and e.fetch_stats.cap == 10 << 20
    monkeypatch.setenv("TSC_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="TSC_CACHE_MAX_BYTES"):
        tsc.open_store(url, cache_dir=cache, storage_options=options)
    monkeypatch.delenv("TSC_CACHE_MAX_BYTES")
    with pytest.raises(ValueError, match="max_bytes"):
        tsc.open_store(url, cache_dir=cache, storage_options=options, max_bytes=0)


# -- housekeeping ---------------------------------------------------------------------------


def test_gc_collects_remote_copies_but_not_what_a_process_maps(
    small: Small, tmp_path: Path
) -> None:
    url, options, rows, shards = small
    cache = tmp_path / "cache"
    open_one = tsc.open_store(url, cache_dir=cache, storage_options=options)
    np.testing.assert_array_equal(open_one[key(1)], cover(key(1)))  # maps shard 0
    closed = tsc.open_store(url, cache_dir=cache, storage_options=options)
    assert closed.prefetch().result() == shards - 1  # the other shards
    closed.close()
    (version,) = [p for p in (cache / "remote").glob("*/*") if p.is_dir()]
    # a download left by a process that died
    ctx = multiprocessing.get_context("spawn")
    dead = ctx.Process(target=os.getpid)
    dead.start()
    dead.join()
    host = os.uname().nodename.replace("-", "_")
    debris = version.parent / f".{version.name}-3.tsc-fetch-{host}-{dead.pid}-abcdef12"
    debris.write_bytes(b"x" * 1000)
    before = _cache_bytes(cache)
    planned = tsc.gc(cache, max_bytes=0, dry_run=True)
    assert _cache_bytes(cache) == before and debris.exists()  # a dry run deletes nothing
    removed = tsc.gc(cache, max_bytes=0)
    assert {(r.kind, r.path) for r in removed} == {(r.kind, r.path) for r in planned}
    assert ("debris", str(debris)) in {(r.kind, r.path) for r in removed}
    collected = [r for r in removed if r.kind == "remote-shard"]
    assert len(collected) == shards - 1 and not debris.exists()
    assert (version / "vectors/c/0/0/0/0").is_file()  # open_one maps shard 0: kept
    assert not [r for r in removed if r.kind == "remote-version"]  # open: kept
    np.testing.assert_array_equal(open_one[key(1)], cover(key(1)))
    np.testing.assert_array_equal(open_one[key(5 * rows)], cover(key(5 * rows)))  # fetched again
    open_one.close()
    removed = tsc.gc(cache, older_than=0)
    assert [r.kind for r in removed] == ["remote-version"] and removed[0].path == str(version)
    assert _cache_bytes(cache) == 0
    again = tsc.open_store(url, cache_dir=cache, storage_options=options)  # downloads anew
    np.testing.assert_array_equal(again[key(7)], cover(key(7)))
