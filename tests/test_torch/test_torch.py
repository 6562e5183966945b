"""tensorstore_cache.torch: StoreDataset under real DataLoaders, fork, spawn and forkserver."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, Subset, default_collate  # noqa: E402

import tensorstore_cache as tsc  # noqa: E402
from tensorstore_cache.reader import view_of  # noqa: E402
from tensorstore_cache.torch import StoreDataset, collate  # noqa: E402

N_BIG = 10_000


def vector_of(path: str) -> np.ndarray:
    """A cheap loader: random float32 values determined by the path."""
    rng = np.random.default_rng(zlib.crc32(path.encode()))
    return rng.random((3, 32, 32), dtype=np.float32)


def bytes_of(path: str) -> np.ndarray:
    """A cheap uint8 loader."""
    rng = np.random.default_rng(zlib.crc32(path.encode()))
    return rng.integers(0, 256, (3, 8, 8), dtype=np.uint8)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tsc.CacheStore:
    """A store of 10,000 vectors (123 MB), several shards."""
    root = tmp_path_factory.mktemp("torch")
    paths = [f"covers/{i % 97}/{i:06d}.jpg" for i in range(N_BIG)]
    return tsc.build_store(paths, root / "big.tsc", loader=vector_of, loader_id="test.vector_of/1",
                           workers=1, progress=False, identity="none")


@pytest.fixture
def small(tmp_path: Path) -> tsc.CacheStore:
    paths = [f"s/{i}.png" for i in range(50)]
    return tsc.build_store(paths, tmp_path / "small.tsc", loader=vector_of, loader_id="t/1",
                           workers=1, progress=False, identity="none")


def test_items_are_zero_copy_views_without_warnings(small: tsc.CacheStore) -> None:
    ds = StoreDataset(small)
    assert len(ds) == len(small)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "The given NumPy array is not writable"
        for i in (0, 17, len(ds) - 1, -1):
            x = ds[i]
            path = small.paths[i]
            assert isinstance(x, torch.Tensor) and x.shape == (3, 32, 32) and x.dtype == torch.float32
            np.testing.assert_array_equal(x.numpy(), vector_of(path))
            assert np.shares_memory(x.numpy(), small[path])  # a view of the mapped file
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds[-len(ds) - 1]


def test_paths_and_targets_follow_the_given_order(small: tsc.CacheStore) -> None:
    paths = [small.paths[i] for i in (5, 3, 5, 0, 49)]
    targets = np.array([0.5, 1.5, 2.5, 3.5, 4.5])
    ds = StoreDataset(small.location, paths, targets)
    assert ds.rows.dtype == np.int64 and list(ds.rows) == [5, 3, 5, 0, 49]
    for i, path in enumerate(paths):
        x, y = ds[i]
        np.testing.assert_array_equal(x.numpy(), vector_of(path))
        assert float(y) == targets[i]
    x, y = ds.batch([4, 0])
    assert x.shape == (2, 3, 32, 32)
    np.testing.assert_array_equal(x[0].numpy(), vector_of(paths[4]))
    assert y.tolist() == [4.5, 0.5]


def test_bad_arguments_are_named(small: tsc.CacheStore, tmp_path: Path) -> None:
    with pytest.raises(tsc.KeyNotInStoreError) as info:
        StoreDataset(small, [small.paths[0], "nope.jpg"])
    assert info.value.missing == ["nope.jpg"]
    with pytest.raises(ValueError, match="one value per item: got 3 for 50"):
        StoreDataset(small, targets=[1, 2, 3])
    with pytest.raises(TypeError, match="factorize"):
        StoreDataset(small, targets=np.array(["a"] * 50))
    with pytest.raises(ValueError, match="as_float=True converts uint8"):
        StoreDataset(small, as_float=True)
    with pytest.raises(tsc.StoreNotFoundError):
        StoreDataset(tmp_path / "absent.tsc")
    with pytest.raises(TypeError, match="batch_sampler"):
        StoreDataset(small).dataloader(4, batch_sampler=None)


def test_pickles_as_a_location_and_reopens_lazily(big: tsc.CacheStore) -> None:
    targets = np.arange(N_BIG, dtype=np.int64)
    ds = StoreDataset(big, targets=targets)
    ds[3]  # the store is open here
    raw = pickle.dumps(ds)
    # the rows and the targets (8 bytes each), the location: never the 123 MB of vectors
    assert len(raw) < ds.rows.nbytes + targets.nbytes + 4096
    assert big.location.encode() in raw
    again = pickle.loads(raw)
    assert again._store is None  # nothing opened until used
    np.testing.assert_array_equal(again[3][0].numpy(), big[big.paths[3]])
    assert again._store is not None


def test_getitems_returns_samples_that_collate_to_the_batch(small: tsc.CacheStore) -> None:
    ds = StoreDataset(small, targets=np.arange(len(small)) * 10)
    idx = [7, 1, 7, 30]
    samples = ds.__getitems__(idx)
    assert isinstance(samples, list) and len(samples) == 4
    x_default, y_default = default_collate(samples)
    x_direct, y_direct = collate(samples)
    assert x_direct is samples.collated[0]  # no second stacking
    expected = np.stack([vector_of(small.paths[i]) for i in idx])
    np.testing.assert_array_equal(x_default.numpy(), expected)
    np.testing.assert_array_equal(x_direct.numpy(), expected)
    assert y_default.tolist() == y_direct.tolist() == [70, 10, 70, 300]
    # a Subset forwards batches to the dataset's own __getitems__
    sub = Subset(ds, [30, 7])
    assert [int(y) for _, y in sub.__getitems__([0, 1])] == [300, 70]
    # ordinary collate input still works
    assert collate([torch.zeros(2), torch.ones(2)]).shape == (2, 2)


def test_transform_applies_per_item_on_every_path(small: tsc.CacheStore) -> None:
    ds = StoreDataset(small, transform=lambda x: x[:, :4, :4] * 2)
    np.testing.assert_array_equal(ds[2].numpy(), vector_of(small.paths[2])[:, :4, :4] * 2)
    batch = collate(ds.__getitems__([2, 3]))
    assert batch.shape == (2, 3, 4, 4)
    np.testing.assert_array_equal(batch[1].numpy(), vector_of(small.paths[3])[:, :4, :4] * 2)
    np.testing.assert_array_equal(ds[[2, 3]].numpy(), batch.numpy())


def test_uint8_store_as_float(tmp_path: Path) -> None:
    paths = [f"u/{i}.png" for i in range(20)]
    store = tsc.build_store(paths, tmp_path / "u8.tsc", loader=bytes_of, loader_id="t/u8",
                            dtype="uint8", workers=1, progress=False, identity="none")
    raw = StoreDataset(store)
    assert raw[0].dtype == torch.uint8
    ds = StoreDataset(store, as_float=True)
    assert ds[4].dtype == torch.float32
    np.testing.assert_array_equal(ds[4].numpy(), tsc.to_float32(bytes_of(paths[4])))
    batch = collate(ds.__getitems__([4, 5]))
    assert batch.dtype == torch.float32
    np.testing.assert_array_equal(batch.numpy(), tsc.to_float32(np.stack([bytes_of(p) for p in paths[4:6]])))
    on_workers = torch.cat(list(ds.dataloader(8, num_workers=1, multiprocessing_context="fork")))
    np.testing.assert_array_equal(on_workers.numpy(), tsc.to_float32(np.stack([bytes_of(p) for p in paths])))


def test_dataloader_method_sequential_and_shuffled(small: tsc.CacheStore) -> None:
    ds = StoreDataset(small, targets=np.arange(len(small)))
    batches = list(ds.dataloader(16))
    assert [len(y) for _, y in batches] == [16, 16, 16, 2]
    assert torch.cat([y for _, y in batches]).tolist() == list(range(len(small)))
    g = torch.Generator().manual_seed(0)
    seen = []
    for x, y in ds.dataloader(16, shuffle=True, drop_last=True, generator=g):
        assert x.shape == (16, 3, 32, 32)
        for xi, yi in zip(x, y, strict=True):
            np.testing.assert_array_equal(xi.numpy(), vector_of(small.paths[int(yi)]))
        seen += y.tolist()
    assert len(seen) == 48 and len(set(seen)) == 48 and seen != sorted(seen)


# -- real DataLoader workers ---------------------------------------------------------


def _anonymous_bytes() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Anonymous line in /proc/self/smaps_rollup")  # pragma: no cover


class MemoryProbe:
    """A collate function that also reports the worker's memory after each batch."""

    def __init__(self, collate_fn: Any) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: Any) -> Any:
        out = self.collate_fn(batch)
        uss = psutil.Process().memory_full_info().uss
        return out, (os.getpid(), uss, _anonymous_bytes())


@pytest.mark.parametrize(
    ("context", "collate_fn"),
    [("fork", default_collate), ("spawn", collate), ("forkserver", collate)],
    ids=["fork-default-collate", "spawn-collate", "forkserver-collate"],
)
def test_dataloader_workers_share_one_copy(big: tsc.CacheStore, context: str, collate_fn: Any) -> None:
    """Two workers read every vector right, and neither holds a private copy of the store."""
    n = len(big)
    # The main process maps (and reads) every page first, as a training script does; a
    # file page mapped by several processes is then counted as shared by each of them.
    expected = big.take(np.arange(n))
    ds = StoreDataset(big, targets=np.arange(n))
    loader = DataLoader(ds, batch_size=250, num_workers=2, multiprocessing_context=context,
                        collate_fn=MemoryProbe(collate_fn), timeout=120)
    first: dict[int, tuple[int, int]] = {}
    last: dict[int, tuple[int, int]] = {}
    seen = 0
    for (x, y), (pid, uss, anon) in loader:
        assert pid != os.getpid()
        np.testing.assert_array_equal(x.numpy(), expected[y.numpy()])
        np.testing.assert_array_equal(y.numpy(), np.arange(seen, seen + len(y)))
        seen += len(y)
        first.setdefault(pid, (uss, anon))
        last[pid] = (uss, anon)
    assert seen == n and len(first) == 2
    uss_growth = sum(last[p][0] - first[p][0] for p in first)
    anon_growth = sum(last[p][1] - first[p][1] for p in first)
    store_bytes = n * big.spec.item_nbytes
    # Each worker touched half of the store (61 MB): a private copy of what it read (new
    # anonymous memory, whatever the start method) would grow the two by 123 MB. What grows
    # without one (the batches' tensors, allocator caches) was 5.5-15.7 MB in seven runs on 2
    # cores, so the bound is a quarter of the store, not an eighth.
    assert anon_growth < store_bytes / 4, (uss_growth, anon_growth, store_bytes)
    # A spawned or forkserver worker inherits no Python heap, so its USS is its own. A forked
    # worker's is not: a full garbage collection in the worker writes to every object it
    # inherited from this process, and copy-on-write then makes each page of that heap the
    # worker's alone. Its USS grows by the heap of the process that forked it (a pytest worker
    # that has run hundreds of tests: 431 MB for two workers, with Anonymous 16 MB lower),
    # while its Anonymous memory, counted before and after the copy alike, does not move.
    if context != "fork":
        assert uss_growth < store_bytes / 4, (uss_growth, anon_growth, store_bytes)
    for k in (0, 4321, n - 1):
        np.testing.assert_array_equal(expected[k], vector_of(big.paths[k]))


def test_dataloader_method_on_forked_workers(big: tsc.CacheStore) -> None:
    ds = StoreDataset(big, big.paths[::-50], targets=np.arange(N_BIG // 50))
    loader = ds.dataloader(64, shuffle=True, num_workers=2, multiprocessing_context="fork", timeout=120)
    got = 0
    for x, y in loader:
        assert x.shape[1:] == (3, 32, 32)
        for xi, yi in zip(x.numpy(), y.tolist(), strict=True):
            np.testing.assert_array_equal(xi, big[big.paths[::-50][yi]])
        got += len(y)
    assert got == N_BIG // 50


def test_core_does_not_import_torch_or_pandas() -> None:
    code = "import sys, tensorstore_cache; print(sorted({'torch', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_dataset_over_a_cached_store_pickles_with_its_reopen_recipe(tmp_path: Path) -> None:
    paths = [f"c/{i}.png" for i in range(30)]
    store = tsc.cached(paths[:20], cache_dir=tmp_path, loader=vector_of, loader_id="t/1",
                       workers=1, progress=False, identity="none")
    store = tsc.cached(paths, cache_dir=tmp_path, loader=vector_of, loader_id="t/1",
                       workers=1, progress=False, identity="none")  # a second part: rows span two segments
    assert len(view_of(store).segments) == 2
    ds = StoreDataset(store, paths[::-1], targets=np.arange(30))
    again = pickle.loads(pickle.dumps(ds))
    assert again._store is None
    x, y = again.batch(np.arange(30))
    np.testing.assert_array_equal(x.numpy(), np.stack([vector_of(p) for p in paths[::-1]]))
    assert y.tolist() == list(range(30))
    np.testing.assert_array_equal(again[29][0].numpy(), vector_of(paths[0]))
