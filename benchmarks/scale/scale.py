"""Measurements behind the scale estimates: per-core decode rate, shard writes, 10M-key index.

Run ``python -m benchmarks.scale [--workdir DIR]`` (about a minute on two cores;
``--keys 1000000`` for a quicker run). It prints one table and writes it, with the
figures, to ``benchmarks/results/scale/scale.json`` and ``.md``, stamped with the run
(``--results DIR``, ``--out NAME`` write them elsewhere). Every figure is measured on this
machine; nothing is extrapolated here (the extrapolation to many nodes is arithmetic on
these figures, done in the documentation).

Sections
--------
loader      items/s of the default image loader on one core, on generated
            cover-like JPEGs/PNGs (``benchmarks.common.make_images``), page cache warm.
build       ``build_store`` end to end (decode, write shards, index, publish)
            with 1 worker and with every core.
shard       ``write_shard`` of full 32 MB float32 shards, fsync included.
mmaps       memory mappings (lines of ``/proc/self/maps``) added per shard read.
copy        a node-local copy of a store through the remote path (``local://``
            URL: download, size + XXH3-128 check of every file, fsync, rename).
metadata    size and parse time of the group ``zarr.json`` of a 10M-image
            float32 / uint8 store (its ``files`` list has one entry per shard).
index       the coordinator's index write for N keys alone; a full N-key
            store (a trivial loader, so only per-item overhead); open time in
            a fresh process; lookup rates at that size.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import tensorstore_cache as tsc
from benchmarks.common._record import Record, add_results_options
from tensorstore_cache.config import SHARD_BYTES
from tensorstore_cache.format.metadata import GroupMetadata, expected_files
from tensorstore_cache.format.shard import write_shard
from tensorstore_cache.format.spec import StoreSpec
from tensorstore_cache.fs.durable import write_json_durable
from tensorstore_cache.writer.assemble import write_index
from tensorstore_cache.writer.layout import rows_per_shard

from ..common.make_images import generate

ITEM = (3, 32, 32)


class TinyLoader:
    """A loader whose cost is only the builder's per-item overhead (one byte per key)."""

    item_shape = (1,)
    params: dict[str, Any] = {}  # noqa: RUF012 - read-only class attribute

    def __call__(self, path: str) -> np.ndarray:
        return np.zeros(1, dtype=np.uint8)


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (user + system)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Clock:
    """Wall and CPU time of a block. On a shared, busy machine the CPU time is the
    robust measure of cost: items per CPU-second is items/s per core."""

    wall = 0.0
    cpu = 0.0

    def __enter__(self) -> Clock:
        self._w, self._c = time.perf_counter(), _cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._w
        self.cpu = _cpu() - self._c


def _cover_paths(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "images").rglob("*") if p.is_file())


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure_loader(paths: list[str], repeats: int = 3) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in paths:  # warm the page cache: we measure decoding, not the disk
        with open(p, "rb") as f:
            f.read()
    for dtype in ("float32", "uint8"):
        loader = tsc.ImageLoader(size=(32, 32), dtype=dtype)
        loader(paths[0])
        best = math.inf
        for _ in range(repeats):
            with Clock() as c:
                for p in paths:
                    loader(p)
            best = min(best, c.cpu)
        out[f"loader_{dtype}_items_per_cpu_s"] = _rate(len(paths), best)
    return out


def measure_build(paths: list[str], work: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    cores = len(os.sched_getaffinity(0))
    for workers in sorted({1, cores}):
        for dtype in ("float32", "uint8"):
            target = work / f"build-{workers}-{dtype}.tsc"
            shutil.rmtree(target, ignore_errors=True)
            with Clock() as c:
                tsc.build_store(paths, target, workers=workers, dtype=dtype, progress=False).close()
            out[f"build_{dtype}_{workers}w_items_per_s_wall"] = _rate(len(paths), c.wall)
            out[f"build_{dtype}_{workers}w_items_per_cpu_s"] = _rate(len(paths), c.cpu)
            out[f"store_{dtype}_bytes_per_item"] = _du(target) / len(paths)
    return out


def measure_shard_writes(work: Path, repeats: int = 8) -> dict[str, float]:
    rows = SHARD_BYTES // (int(np.prod(ITEM)) * 4)
    block = np.random.default_rng(0).random((rows, *ITEM), dtype=np.float32)
    d = work / "shards"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    total = 0
    with Clock() as c:
        for k in range(repeats):
            size, _ = write_shard(d / str(k), block, rows)
            total += size
    shutil.rmtree(d)
    return {
        "shard_rows_float32": rows,
        "shard_write_MB_per_s_wall": total / c.wall / 1e6,
        "shard_write_MB_per_cpu_s": total / c.cpu / 1e6,
    }


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def measure_mmaps(work: Path) -> dict[str, float]:
    store = tsc.open_store(work / f"build-{len(os.sched_getaffinity(0))}-float32.tsc")
    shards = math.ceil(len(store) / store.spec.rows_per_shard)
    before = _maps()
    store.take(np.arange(len(store)))
    after = _maps()
    store.close()
    return {"mmaps_shards": shards, "mmaps_per_shard": (after - before) / shards}


def measure_copy(work: Path) -> dict[str, float]:
    src = work / f"build-{len(os.sched_getaffinity(0))}-float32.tsc"
    cache = work / "copy-cache"
    shutil.rmtree(cache, ignore_errors=True)
    size = _du(src)
    with Clock() as first:
        tsc.open_store(f"local://{src}", cache_dir=cache).close()
    with Clock() as again:
        tsc.open_store(f"local://{src}", cache_dir=cache).close()
    return {
        "copy_MB": size / 1e6,
        "copy_MB_per_s_wall": size / first.wall / 1e6,
        "reopen_copy_ms_wall": again.wall * 1e3,
    }


def measure_metadata(work: Path, n: int = 10_000_000) -> dict[str, float]:
    """Write the metadata of an n-image store (no data) and time its validation."""
    out: dict[str, float] = {}
    # shard length the builder picks for 10M items: with 2 workers (32 MB shards, the
    # cap) and with workers=3200 (100 nodes x 32 cores: ~4 shards per worker)
    for dtype, workers in (("float32", 2), ("float32", 3200), ("uint8", 2), ("uint8", 3200)):
        item_nbytes = int(np.prod(ITEM)) * np.dtype(dtype).itemsize
        spec = StoreSpec(
            n=n, item_shape=ITEM, dtype=dtype, loader_id="tensorstore_cache.image/1",
            loader_params={}, rows_per_shard=rows_per_shard(n, item_nbytes, workers),
        )
        key_bytes_len = n * 40
        root = work / f"meta-{dtype}-{workers}.tsc"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        files = {rel: (SHARD_BYTES, "0" * 32) for rel in expected_files(spec, key_bytes_len)}
        meta = GroupMetadata(spec=spec, files=files, key_bytes_len=key_bytes_len)
        for name, doc in meta.array_documents().items():
            (root / name).mkdir()
            write_json_durable(root / name / "zarr.json", doc)
        meta.write(root)
        times = []
        for _ in range(5):
            with Clock() as c:
                GroupMetadata.read(root)
            times.append(c.cpu)
        shards = math.ceil(n / spec.rows_per_shard)
        tag = f"meta{_size_tag(n)}_{dtype}_{workers}w"
        out[f"{tag}_rows_per_shard"] = spec.rows_per_shard
        out[f"{tag}_shards"] = shards
        out[f"{tag}_shard_MB"] = spec.rows_per_shard * item_nbytes / 1e6
        out[f"{tag}_group_json_bytes"] = (root / "zarr.json").stat().st_size
        out[f"{tag}_parse_ms_cpu"] = float(np.median(times)) * 1e3
        shutil.rmtree(root)
    return out


def _synthetic_keys(n: int) -> list[str]:
    nums = np.random.default_rng(1).choice(9_000_000_000, size=n, replace=False) + 1_000_000_000
    return [f"images/{i % 256:02x}/{(i // 256) % 256:02x}/{int(x)}.01.THUMBZZZ.jpg" for i, x in enumerate(nums.tolist())]


_OPEN_SNIPPET = """
import sys, time
import tensorstore_cache as tsc
w, c = time.perf_counter(), time.process_time()
s = tsc.open_store(sys.argv[1])
print(time.perf_counter() - w, time.process_time() - c)
"""


def _lookup_rate(fn: Any, items: list[Any], repeats: int = 3) -> float:
    best = math.inf
    for _ in range(repeats):
        with Clock() as c:
            for item in items:
                fn(item)
        best = min(best, c.cpu)
    return _rate(len(items), best)


def _size_tag(n: int) -> str:
    """``10M`` for 10,000,000, ``2000`` for 2,000: how a size names its figures."""
    return f"{n // 1_000_000}M" if n >= 1_000_000 else str(n)


def measure_index(work: Path, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    tag = _size_tag(n)
    t0 = time.perf_counter()
    keys = _synthetic_keys(n)
    out[f"index{tag}_make_keys_s"] = time.perf_counter() - t0
    # the coordinator's share: encode, hash, sort and write the index arrays
    d = work / f"index-only-{tag}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    minus = np.full(n, -1, dtype=np.int64)
    with Clock() as c:
        write_index(d, keys, minus, minus)
    out[f"index{tag}_write_s_wall"] = c.wall
    out[f"index{tag}_write_s_cpu"] = c.cpu
    out[f"index{tag}_bytes"] = _du(d)
    shutil.rmtree(d)
    # a whole store of n keys with a loader that costs nothing
    target = work / f"keys-{tag}.tsc"
    shutil.rmtree(target, ignore_errors=True)
    with Clock() as c:
        tsc.build_store(
            keys, target, loader=TinyLoader(), loader_id="tiny", dtype="uint8", progress=False, identity="none"
        ).close()
    out[f"index{tag}_tiny_build_s_wall"] = c.wall
    out[f"index{tag}_tiny_build_s_cpu"] = c.cpu
    # open in fresh processes (import excluded)
    walls, cpus = [], []
    for _ in range(5):
        res = subprocess.run(
            [sys.executable, "-c", _OPEN_SNIPPET, str(target)], capture_output=True, text=True,
            check=True,
        )
        w, cpu = map(float, res.stdout.split())
        walls.append(w)
        cpus.append(cpu)
    out[f"index{tag}_open_ms_wall"] = float(np.median(walls)) * 1e3
    out[f"index{tag}_open_ms_cpu"] = float(np.median(cpus)) * 1e3
    store = tsc.open_store(target)
    rng = np.random.default_rng(2)
    probe = [keys[i] for i in rng.integers(0, n, 20_000).tolist()]
    out[f"index{tag}_getitem_per_cpu_s"] = _lookup_rate(store.__getitem__, probe)
    out[f"index{tag}_contains_per_cpu_s"] = _lookup_rate(store.__contains__, probe)
    miss = [k + ".missing" for k in probe]
    out[f"index{tag}_miss_per_cpu_s"] = _lookup_rate(store.__contains__, miss)
    batches = [
        [keys[i] for i in rng.integers(0, n, 256).tolist()] for _ in range(200)
    ]
    out[f"index{tag}_rows_batch256_keys_per_cpu_s"] = 256 * _lookup_rate(store.rows, batches)
    store.close()
    # a node-local copy of it through the remote path (download, verify, fsync, rename)
    cache = work / "copy-cache-keys"
    shutil.rmtree(cache, ignore_errors=True)
    size = _du(target)
    with Clock() as c:
        tsc.open_store(f"local://{target}", cache_dir=cache).close()
    out[f"index{tag}_store_MB"] = size / 1e6
    out[f"index{tag}_copy_MB_per_s_wall"] = size / c.wall / 1e6
    shutil.rmtree(cache)
    shutil.rmtree(target)
    return out


def _table(results: dict[str, float]) -> str:
    width = max(len(k) for k in results)
    lines = []
    for k, v in results.items():
        shown = f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"
        lines.append(f"{k:<{width}}  {shown:>16}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None,
                        help="work directory (default: a temporary one)")
    parser.add_argument("--images", type=int, default=3000, help="generated covers to decode")
    parser.add_argument("--keys", default="10000000", help="comma-separated index sizes")
    parser.add_argument("--metadata-images", type=int, default=10_000_000,
                        help="images of the store whose metadata is written and parsed")
    add_results_options(parser, "scale")
    args = parser.parse_args(argv)
    record = Record("benchmarks.scale", argv, results=args.results, name=args.out)
    record.config = {"images": args.images, "keys": args.keys,
                     "metadata_images": args.metadata_images}
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="tsc-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, float] = {"cores": float(len(os.sched_getaffinity(0)))}
    generate(work / "covers", args.images, seed=0, quiet=True)
    paths = _cover_paths(work / "covers")
    steps = [
        ("loader", lambda: measure_loader(paths)),
        ("build", lambda: measure_build(paths, work)),
        ("shard", lambda: measure_shard_writes(work)),
        ("mmaps", lambda: measure_mmaps(work)),
        ("copy", lambda: measure_copy(work)),
        ("metadata", lambda: measure_metadata(work, args.metadata_images)),
    ]
    steps += [(f"index {n}", lambda n=n: measure_index(work, n)) for n in map(int, args.keys.split(",")) if n]
    for name, step in steps:
        t0 = time.perf_counter()
        got = step()
        results.update(got)
        print(f"[{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
    record.figures.update(results)
    record.print("```text")
    record.print(_table(results))
    record.print("```")
    record.save(workdir=work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
