"""Hugging Face ``datasets``: the two documented feature types for a fixed-shape vector.

Why the benchmark's ``hf_datasets`` method stores a fixed-size list: it is the faster
of ``List(Value("float32"), length=3072)`` and ``Array3D((3, 32, 32), "float32")`` here.

Run::

    python -m benchmarks.run.hf_features [--items 10000]

Its table is printed and written, with its figures, to
``benchmarks/results/run/hf-features.json`` and ``.md``, stamped with the run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common._record import RESULTS, Record


def _rate(fn: Any, args: list[Any], budget: float = 1.0) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget:
        fn(args[done % len(args)])
        done += 1
    return done / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    import datasets

    datasets.disable_progress_bars()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the datasets are saved (default: a temporary directory)")
    parser.add_argument("--results", type=Path, default=RESULTS / "run",
                        help="results directory (default benchmarks/results/run)")
    parser.add_argument("--out", default="hf-features", help="results name (default hf-features)")
    args = parser.parse_args(argv)
    record = Record("benchmarks.run.hf_features", argv, results=args.results, name=args.out)
    record.config = {"items": args.items}
    n = args.items
    rng = np.random.default_rng(0)
    vectors = rng.random((n, 3, 32, 32), dtype=np.float32)
    features = {
        "fixed-size list": datasets.Features(
            {"v": datasets.List(datasets.Value("float32"), length=3 * 32 * 32)}
        ),
        "Array3D": datasets.Features({"v": datasets.Array3D((3, 32, 32), "float32")}),
    }
    batches = [rng.choice(n, 256, replace=False) for _ in range(32)]
    singles = rng.integers(0, n, 1000).tolist()
    record.print(f"{n:,} vectors of 3x32x32 float32, datasets {datasets.__version__}")
    record.print("| feature type | single items/s | batch-256 items/s |")
    record.print("|---|---:|---:|")
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for name, feats in features.items():
            column = vectors.reshape(n, -1) if name == "fixed-size list" else vectors
            ds = datasets.Dataset.from_dict({"v": column}, features=feats)
            path = f"{tmp}/{name.replace(' ', '_')}"
            ds.save_to_disk(path)
            ds = datasets.load_from_disk(path).with_format("numpy")
            single = _rate(lambda i, d=ds: d[i]["v"], singles)
            batch = _rate(lambda rows, d=ds: d[rows]["v"], batches) * 256
            record.figures[name] = {"single_items_per_s": single, "batch_items_per_s": batch}
            record.print(f"| {name} | {single:,.0f} | {batch:,.0f} |")
    record.save(workdir=args.workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
