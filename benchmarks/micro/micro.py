"""Micro-benchmarks of the tensorstore_cache core.

Run ``python -m benchmarks.micro [--images N] [--workdir DIR] [--quick]``. Measures:

- build speed-up: the same cover images built with 2 worker processes vs 1;
- open time of a fresh process at 5,000 and 50,000 items (median of 3 processes);
- single lookups by path per second (``store[path]``), next to a plain
  ``dict`` + ``np.memmap`` view of the same bytes;
- bulk lookups (``store.rows`` of 100,000 paths) in keys per second, next to a
  ``dict`` lookup of every path into an ``int64`` array;
- the same on the cover paths of the build (absolute paths, as the sweep's ratings
  tables hold them): every cover once, shuffled, and every row of ``ratings.csv`` (the
  covers with their repeats, in the table's order);
- ``store.take`` of 256 random rows (new array, and into ``out=``) vs a plain
  ``np.memmap`` fancy-index gather of the same rows from a flat file of the same bytes.

Each measurement alternates with its reference in short rounds and keeps the best round
of each (builds: 1, 2, 1, 2 workers, the faster of each), so that both see the same load
and the ratio holds on a shared machine where two separate timings would not.

Prints a table with the ratios and writes ``benchmarks/results/micro/micro.json`` and its
table, ``micro.md``, stamped with the run (``--results DIR``, ``--out NAME`` write them
elsewhere: ``--images 5000 --out micro-5000``).
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import make_images
from benchmarks.common._record import add_results_options
from benchmarks.common._report import compile_sources, environment, publish
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import run_stamp
from benchmarks.common.methods._base import ITEM_SHAPE, SIZE, SyntheticLoader


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _open_in_fresh_process(location: str) -> float:
    """Run in a spawned process: import the library, then time ``open_store``."""
    import tensorstore_cache as tsc

    t0 = time.perf_counter()
    store = tsc.open_store(location)
    seconds = time.perf_counter() - t0
    store.close()
    return seconds


def _rates(fns: dict[str, Any], args: list[Any], budget_s: float) -> dict[str, float]:
    """Calls per second of each ``fn(a)``: the best of rounds that alternate between them.

    Every round runs each function over the same 2,048 arguments (cycling over
    ``args``); rounds go on for about ``budget_s`` per function, at least 5.
    """
    for fn in fns.values():
        for a in args[:3]:
            fn(a)
    best = dict.fromkeys(fns, 0.0)
    size, start, rounds = 2048, 0, 0
    end = time.perf_counter() + budget_s * len(fns)
    while rounds < 5 or time.perf_counter() < end:
        batch = args[start : start + size]
        start = (start + size) % len(args)
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for a in batch:
                fn(a)
            best[name] = max(best[name], len(batch) / (time.perf_counter() - t0))
        rounds += 1
    return best


def _best_times(fns: dict[str, Any], reps: int) -> dict[str, float]:
    """Seconds of each ``fn()``: the fastest of ``reps`` rounds that alternate between them."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def bench_build(paths: list[str], work: Path) -> dict[str, Any]:
    import tensorstore_cache as tsc

    for p in paths:  # the same warm page cache for both builds
        with open(p, "rb") as f:
            f.read()
    out: dict[str, Any] = {"items": len(paths)}
    for workers in (1, 2, 1, 2):
        target = work / f"build-{workers}.tsc"
        shutil.rmtree(target, ignore_errors=True)
        t0 = time.perf_counter()
        tsc.build_store(paths, target, size=SIZE, workers=workers, progress=False).close()
        seconds = time.perf_counter() - t0
        key = f"workers_{workers}_s"
        out[key] = min(out.get(key, seconds), seconds)
        log(f"build, {workers} worker(s): {seconds:.2f} s")
    out["speedup_2_over_1"] = out["workers_1_s"] / out["workers_2_s"]
    shutil.rmtree(work / "build-1.tsc", ignore_errors=True)
    return out


def synthetic_store(n: int, work: Path) -> Path:
    import tensorstore_cache as tsc

    target = work / f"synthetic-{n}.tsc"
    shutil.rmtree(target, ignore_errors=True)
    paths = [f"/synthetic/{i // 1000:04d}/{i:08d}.jpg" for i in range(n)]
    loader = SyntheticLoader()
    tsc.build_store(paths, target, loader=loader, loader_id=loader.loader_id, workers=2,
                    progress=False, identity="none").close()
    return target


def bench_open(sizes: list[int], work: Path, procs: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {}
    for n in sizes:
        location = str(synthetic_store(n, work))
        times = []
        for _ in range(procs):
            with ctx.Pool(1) as pool:  # one fresh interpreter per measurement
                times.append(pool.apply(_open_in_fresh_process, (location,)))
        out[str(n)] = {"open_s_median": statistics.median(times), "open_s": times}
        log(f"open, {n} items: median {statistics.median(times) * 1e3:.2f} ms of {times}")
    return out


def bench_access(location: Path, work: Path, budget_s: float) -> dict[str, Any]:
    import tensorstore_cache as tsc

    store = tsc.open_store(location)
    n = len(store)
    paths = store.paths
    flat = work / "flat.f32"
    data = np.memmap(flat, dtype=np.float32, mode="w+", shape=(n, *ITEM_SHAPE))
    for start in range(0, n, 4096):
        store.take(np.arange(start, min(n, start + 4096)), out=data[start : start + 4096])
    data.flush()
    del data
    raw = np.memmap(flat, dtype=np.float32, mode="c", shape=(n, *ITEM_SHAPE)).view(np.ndarray)
    row_of = {p: i for i, p in enumerate(paths)}
    rng = np.random.default_rng(0)
    picks = [paths[i] for i in rng.integers(0, n, 100_000).tolist()]
    for a, b in ((0, n), (0, n)):  # warm both mappings
        store.take(np.arange(a, b, 64))
        raw[a:b:64].sum()
    out: dict[str, Any] = {"items": n, "rows_keys": len(picks)}
    rates = _rates({"store": store.__getitem__, "dict": lambda p: raw[row_of[p]]}, picks, budget_s)
    out["lookup_store_per_s"] = rates["store"]
    out["lookup_dict_memmap_per_s"] = rates["dict"]
    out["lookup_ratio"] = out["lookup_store_per_s"] / out["lookup_dict_memmap_per_s"]
    times = _best_times({
        "store": lambda: store.rows(picks),
        "dict": lambda: np.fromiter(map(row_of.__getitem__, picks), np.int64, len(picks)),
    }, 7)
    out["rows_keys_per_s"] = len(picks) / times["store"]
    out["rows_dict_keys_per_s"] = len(picks) / times["dict"]
    out["rows_ratio"] = out["rows_keys_per_s"] / out["rows_dict_keys_per_s"]
    batches = [rng.choice(n, 256, replace=False) for _ in range(64)]
    buf = np.empty((256, *ITEM_SHAPE), dtype=np.float32)
    per_batch = [
        _best_times({
            "take_256_s": lambda r=r: store.take(r),
            "take_256_out_s": lambda r=r: store.take(r, out=buf),
            "memmap_gather_256_s": lambda r=r: raw[r],
        }, 5)
        for r in batches
    ]
    for key in ("take_256_s", "take_256_out_s", "memmap_gather_256_s"):
        out[key] = statistics.median(t[key] for t in per_batch)
    for key in ("take_256", "take_256_out", "memmap_gather_256"):
        out[f"{key}_items_per_s"] = 256 / out[f"{key}_s"]
    out["take_ratio"] = out["memmap_gather_256_s"] / out["take_256_s"]
    out["take_out_ratio"] = out["memmap_gather_256_s"] / out["take_256_out_s"]
    assert np.array_equal(store.take(batches[0]), raw[batches[0]])
    store.close()
    flat.unlink()
    return out


def bench_cover_rows(location: Path, data: Path) -> dict[str, Any]:
    """``store.rows`` on the cover paths of a store built from them, vs dict lookups."""
    import tensorstore_cache as tsc

    store = tsc.open_store(location)
    row_of = {p: i for i, p in enumerate(store.paths)}
    rng = np.random.default_rng(1)
    unique = [store.paths[i] for i in rng.permutation(len(store)).tolist()]
    prefix = str(data) + os.sep
    with open(data / make_images.RATINGS, newline="", encoding="utf-8") as f:
        ratings = [prefix + row["img_path"] for row in csv.DictReader(f)]
    ratings = [p for p in ratings if p in row_of]  # covers the build skipped, if any
    out: dict[str, Any] = {"covers": len(unique), "ratings_rows": len(ratings),
                           "key_bytes_mean": sum(map(len, unique)) / max(1, len(unique))}
    for name, keys in (("unique", unique), ("ratings", ratings)):
        times = _best_times({
            "store": lambda k=keys: store.rows(k),
            "dict": lambda k=keys: np.fromiter(map(row_of.__getitem__, k), np.int64, len(k)),
        }, 9)
        assert np.array_equal(store.rows(keys), [row_of[k] for k in keys])
        out[f"{name}_keys_per_s"] = len(keys) / times["store"]
        out[f"{name}_dict_keys_per_s"] = len(keys) / times["dict"]
        out[f"{name}_ratio"] = out[f"{name}_keys_per_s"] / out[f"{name}_dict_keys_per_s"]
        log(f"rows() of {len(keys):,} cover paths ({name}): "
            f"{out[f'{name}_keys_per_s'] / 1e6:.2f}M keys/s, dict "
            f"{out[f'{name}_dict_keys_per_s'] / 1e6:.2f}M")
    store.close()
    return out


def table(res: dict[str, Any]) -> str:
    b, o, a = res["build"], res["open"], res["access"]
    len_picks = a.get("rows_keys", 100_000)
    sizes = sorted(o, key=int)
    lines = [
        "# tensorstore_cache micro-benchmarks",
        "",
        f"{res['env']['cpu']}, {res['env']['cores']} cores, Python {res['env']['python']}; "
        f"command `{res['env']['command']}`.",
        "",
        "| measurement | tensorstore_cache | reference | ratio |",
        "|---|---:|---:|---:|",
        f"| build {b['items']:,} covers, 2 workers vs 1 | {b['workers_2_s']:.2f} s "
        f"| {b['workers_1_s']:.2f} s | {b['speedup_2_over_1']:.2f}x faster |",
        f"| open in a fresh process, {int(sizes[-1]):,} vs {int(sizes[0]):,} items "
        f"| {o[sizes[-1]]['open_s_median'] * 1e3:.2f} ms "
        f"| {o[sizes[0]]['open_s_median'] * 1e3:.2f} ms "
        f"| {o[sizes[-1]]['open_s_median'] / o[sizes[0]]['open_s_median']:.2f}x |",
        f"| single lookups/s by path ({a['items']:,} items), vs dict + memmap view "
        f"| {a['lookup_store_per_s']:,.0f} | {a['lookup_dict_memmap_per_s']:,.0f} "
        f"| {a['lookup_ratio']:.2f}x |",
        f"| rows() of {len_picks:,} paths, keys/s, vs dict lookups into an int64 array "
        f"| {a['rows_keys_per_s']:,.0f} | {a['rows_dict_keys_per_s']:,.0f} "
        f"| {a['rows_ratio']:.2f}x |",
        *(
            f"| rows() of {c[name + '_n']:,} cover paths ({what}), keys/s, vs dict lookups "
            f"| {c[name + '_keys_per_s']:,.0f} | {c[name + '_dict_keys_per_s']:,.0f} "
            f"| {c[name + '_ratio']:.2f}x |"
            for c in [dict(res["covers"], unique_n=res["covers"]["covers"],
                           ratings_n=res["covers"]["ratings_rows"])] if "covers" in res
            for name, what in (("unique", "each once"), ("ratings", "the ratings rows"))
        ),
        f"| take 256 random rows, items/s, vs np.memmap fancy index "
        f"| {a['take_256_items_per_s']:,.0f} | {a['memmap_gather_256_items_per_s']:,.0f} "
        f"| {a['take_ratio']:.2f}x |",
        f"| take 256 random rows into out=, items/s, vs np.memmap fancy index "
        f"| {a['take_256_out_items_per_s']:,.0f} | {a['memmap_gather_256_items_per_s']:,.0f} "
        f"| {a['take_out_ratio']:.2f}x |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=None, help="covers to build (default 20000)")
    parser.add_argument("--open-sizes", default=None, help="store sizes (default 5000,50000)")
    parser.add_argument("--workdir", type=Path, default=None)
    add_results_options(parser, "micro")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for tests")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    images = args.images or (200 if args.quick else 20_000)
    sizes = ([int(s) for s in args.open_sizes.split(",")] if args.open_sizes
             else ([500, 2000] if args.quick else [5000, 50_000]))
    budget = 0.2 if args.quick else 1.0
    base = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-bench").resolve()
    work = base / "micro"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    data = base / f"data-{images}-s{args.seed}"
    make_images.generate(data, images, args.seed)
    paths = [str(p) for p in sorted((data / "images").rglob("*.*"))]
    compile_sources()
    env = environment()
    run = run_stamp("benchmarks.micro", argv, env)
    env["command"] = run["command"]
    res: dict[str, Any] = {"env": env}
    res["build"] = bench_build(paths, work)
    res["covers"] = bench_cover_rows(work / "build-2.tsc", data)
    res["open"] = bench_open(sizes, work, procs=3)
    res["access"] = bench_access(work / f"synthetic-{max(sizes)}.tsc", work, budget)
    shutil.rmtree(work, ignore_errors=True)
    print(publish(ResultsFile(args.results, args.out), res, table, run, data=data, workdir=base,
                  results=args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
