"""Lazy remote stores: time to first batch and bytes fetched, lazy vs whole copy; the cap's cost.

Run ``python -m benchmarks.remote`` (a real S3 API, moto, in its own process on
127.0.0.1, counting every byte it serves) or ``--url s3://bucket/prefix.tsc
--storage-options '{...}'`` for a real bucket (the store is built and uploaded
there first unless ``--no-build``). Every reading scenario runs in a fresh
process with an empty node cache; bytes are counted by the server (moto) or by
the process (``fetch_stats``, with ``--url``). Its tables are printed and written, with
every figure, to ``benchmarks/results/remote/remote.json`` and ``.md``, stamped with the run
(``--results DIR``, ``--out NAME`` write them elsewhere).

Scenarios
---------
first batch    open + one ``take`` of 256 random rows: lazy (shards on demand) vs
               whole copy (open + ``prefetch()`` of every shard, as a copy of the
               whole store before the first read).
fraction       reading 1 %, 10 %, 100 % of the rows in batches of 256: a random subset,
               and one contiguous range of rows (a subset of the paths in build order,
               e.g. a fold or a class), lazy vs whole copy.
capped         on a warm node cache: ``store[p]`` and ``take`` of 256 random rows per
               second, uncapped (views of one contiguous mapping) vs capped
               (``max_bytes``: copies, a budget of mapped shards).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common._record import Record, add_results_options

ITEM = (3, 32, 32)


def cover(path: str) -> np.ndarray:
    """A cheap stand-in for a decoded cover: random, reproducible from its name."""
    i = int(path.rsplit("/", 1)[1].split(".")[0])
    return np.random.default_rng(i).random(ITEM, dtype=np.float32)


def _key(i: int) -> str:
    return f"/covers/{i}.jpg"


# -- what a fresh process does -------------------------------------------------------------


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import tensorstore_cache as tsc
    from tensorstore_cache.reader import view_of

    t0 = time.perf_counter()
    store = tsc.open_store(spec["url"], cache_dir=spec["cache"],
                           storage_options=spec["options"], max_bytes=spec.get("max_bytes"))
    opened = time.perf_counter() - t0
    n = len(store)
    rng = np.random.default_rng(spec.get("seed", 0))
    out: dict[str, Any] = {"open_s": opened}
    mode = spec["mode"]
    if spec.get("whole"):
        store.prefetch()  # every shard, as a whole copy would
        out["copied_s"] = time.perf_counter() - t0
    if mode == "first":
        rows = rng.choice(n, 256, replace=False)
        store.take(rows)
        out["first_batch_s"] = time.perf_counter() - t0
    elif mode == "fraction":
        count = max(1, int(n * spec["fraction"]))
        if spec.get("contiguous"):  # a subset of the paths in build order (a fold, a class)
            first = int(rng.integers(0, n - count + 1))
            rows = rng.permutation(np.arange(first, first + count))
        else:
            rows = rng.permutation(n)[:count]
        for start in range(0, len(rows), 256):
            store.take(rows[start : start + 256])
        out["total_s"] = time.perf_counter() - t0
    elif mode == "capped":
        store.prefetch()  # warm: every shard local; then only reading is timed
        keys = [_key(int(i)) for i in rng.integers(0, n, 20_000)]
        for k in keys[:1000]:
            store[k]
        t = time.perf_counter()
        for k in keys:
            store[k]
        out["getitem_us"] = (time.perf_counter() - t) / len(keys) * 1e6
        batches = [rng.integers(0, n, 256) for _ in range(300)]
        for b in batches[:30]:
            store.take(b)
        t = time.perf_counter()
        for b in batches:
            store.take(b)
        out["take256_ms"] = (time.perf_counter() - t) / len(batches) * 1e3
        out["budget"] = view_of(store).segments[0].arrays["vectors"].budget
    stats = store.fetch_stats
    out["fetched_bytes"] = stats.bytes if stats else 0
    out["fetched_shards"] = stats.shards if stats else 0
    return out


def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.remote", "--child", json.dumps(spec)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# -- the driver ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="covers in the store")
    parser.add_argument("--shard-bytes", type=int, default=1 << 20)
    parser.add_argument("--url", default=None, help="a real bucket instead of moto")
    parser.add_argument("--storage-options", default="{}", help="JSON, with --url")
    parser.add_argument("--no-build", action="store_true", help="the store at --url exists")
    parser.add_argument("--repeat", type=int, default=3, help="runs per scenario (median)")
    parser.add_argument("--quick", action="store_true",
                        help="the lazy first batch, 10%% of rows at random and the cap only")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the node caches go (default: a temporary directory)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_results_options(parser, "remote")
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(_child(json.loads(args.child))))
        return
    record = Record("benchmarks.remote", argv, results=args.results, name=args.out)
    record.config = {"n": args.n, "shard_bytes": args.shard_bytes, "repeat": args.repeat,
                     "server": "moto on 127.0.0.1" if args.url is None else "--url"}

    import tensorstore_cache as tsc

    server = None
    if args.url is None:
        from ..common.s3server import S3Process

        server = S3Process()
        server.create_bucket("bench")
        url, options = "s3://bench/covers.tsc", server.storage_options()
    else:
        url, options = args.url, json.loads(args.storage_options)
    try:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="tsc-remote-bench-", dir=args.workdir) as tmp:
            work = Path(tmp)
            if not args.no_build:
                t = time.perf_counter()
                tsc.build_store([_key(i) for i in range(args.n)], url, loader=cover,
                                loader_id="bench.cover/1", shard_bytes=args.shard_bytes,
                                workers=1, progress=False, cache_dir=work / "builder",
                                storage_options=options, overwrite=True, identity="none").close()
                record.print(f"built and uploaded {args.n} covers in "
                             f"{time.perf_counter() - t:.1f} s")
                record.print()
            probe = tsc.open_store(url, cache_dir=work / "probe", storage_options=options)
            spec_ = probe.spec
            shards = -(-spec_.n // spec_.rows_per_shard)
            store_bytes = sum(size for size, _ in _files(Path(probe.location)).values())
            probe.close()
            record.print(f"store: {spec_.n} x {spec_.item_shape} {spec_.dtype}, {shards} shards "
                         f"of {spec_.rows_per_shard} rows, {store_bytes / 1e6:.1f} MB; medians of "
                         f"{args.repeat} fresh processes")
            record.print()
            results = record.figures
            results.update({"n": spec_.n, "shards": shards, "bytes": store_bytes,
                            "rows_per_shard": spec_.rows_per_shard})
            runs = 0

            def measure(**spec: Any) -> dict[str, Any]:
                nonlocal runs
                got = []
                for r in range(args.repeat):
                    runs += 1
                    cache = work / f"cache-{runs}"
                    if server is not None:
                        server.reset()
                    one = _run_child({"url": url, "options": options, "cache": str(cache),
                                      "seed": r, **spec})
                    if server is not None:
                        one["served_bytes"] = sum(x.sent for x in server.requests("GET"))
                        one["requests"] = len(server.requests("GET"))
                    got.append(one)
                keys = got[0].keys()
                return {k: float(np.median([g[k] for g in got])) for k in keys
                        if isinstance(got[0][k], (int, float))}

            lines = ["| scenario | time (s) | bytes fetched | requests |", "|---|---|---|---|"]

            def row(name: str, r: dict[str, Any], key: str) -> None:
                served = r.get("served_bytes", r["fetched_bytes"])
                lines.append(f"| {name} | {r[key]:.3f} | {served / 1e6:.2f} MB | "
                             f"{int(r.get('requests', 0)) or '-'} |")

            lazy = measure(mode="first")
            results["first_batch"] = {"lazy": lazy}
            row("open (lazy: metadata + index)", lazy, "open_s")
            row("first batch of 256, lazy", lazy, "first_batch_s")
            if not args.quick:
                whole = results["first_batch"]["whole"] = measure(mode="first", whole=True)
                row("first batch of 256, whole copy first", whole, "first_batch_s")
            results["fraction"] = {}
            for fraction in (0.1,) if args.quick else (0.01, 0.1, 1.0):
                r = measure(mode="fraction", fraction=fraction)
                results["fraction"][str(fraction)] = r
                row(f"read {fraction:.0%} of rows (random), lazy", r, "total_s")
                if fraction < 1 and not args.quick:
                    r = measure(mode="fraction", fraction=fraction, contiguous=True)
                    results["fraction"][f"{fraction}-contiguous"] = r
                    row(f"read {fraction:.0%} of rows (one range of paths), lazy", r, "total_s")
            if not args.quick:
                w = measure(mode="fraction", fraction=1.0, whole=True)
                results["fraction"]["whole"] = w
                row("read 100% of rows, whole copy first", w, "total_s")
            uncapped = measure(mode="capped")
            capped = measure(mode="capped", max_bytes=4 * store_bytes)
            results["capped"] = {"uncapped": uncapped, "capped": capped}
            for line in lines:
                record.print(line)
            record.print()
            record.print("| warm node cache | store[p] (us) | take 256 (ms) |")
            record.print("|---|---|---|")
            record.print(f"| uncapped: views of one mapping | {uncapped['getitem_us']:.2f} | "
                         f"{uncapped['take256_ms']:.3f} |")
            record.print(f"| capped (max_bytes, budget {int(capped['budget'])} shards): copies | "
                         f"{capped['getitem_us']:.2f} | {capped['take256_ms']:.3f} |")
            record.print(f"| ratio capped / uncapped | "
                         f"{capped['getitem_us'] / uncapped['getitem_us']:.1f}x"
                         f" | {capped['take256_ms'] / uncapped['take256_ms']:.2f}x |")
            record.save(workdir=args.workdir or work)
    finally:
        if server is not None:
            server.stop()


def _files(root: Path) -> dict[str, tuple[int, str]]:
    from tensorstore_cache.format.metadata import GroupMetadata

    return GroupMetadata.read(root).files


if __name__ == "__main__":
    main()
