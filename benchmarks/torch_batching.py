"""How fast a DataLoader epoch over a StoreDataset is, for each way of batching.

Run ``python -m benchmarks.torch_batching [--items N] [--batch B] [--workers W]``.
Builds a store of ``N`` random ``3 x 32 x 32`` float32 vectors (a synthetic
loader, no images), then times shuffled epochs (median of ``--repeat``, after
one warm-up epoch; persistent workers, so worker start-up is not counted):

- ``per-item``: ``__getitems__`` hidden, the loader calls ``ds[i]`` per item and
  torch's default collate stacks them (what a plain map-style dataset gets);
- ``getitems``: ``DataLoader(ds, batch_size=B)``: one ``store.take`` per batch,
  then default collate stacks the samples again;
- ``getitems+collate``: the same with ``collate_fn=tensorstore_cache.torch.collate``,
  which returns the gathered batch without stacking again;
- ``ds.dataloader``: ``ds.dataloader(B, shuffle=True)``, a ``DataLoader`` with a
  ``BatchSampler`` that gathers each batch at once (in workers: straight into
  shared memory).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

import tensorstore_cache as tsc
from tensorstore_cache.torch import StoreDataset, collate


def random_vector(path: str) -> np.ndarray:
    """A cheap deterministic loader: random float32 values seeded by the path."""
    seed = int.from_bytes(path.encode()[-8:].rjust(8, b"\0"), "little")
    return np.random.default_rng(seed).random((3, 32, 32), dtype=np.float32)


class PerItem(StoreDataset):
    """The same dataset with the batch path hidden (DataLoader falls back to ds[i])."""

    __getitems__ = None  # type: ignore[assignment]


def make_loader(mode: str, ds: StoreDataset, batch: int, workers: int) -> DataLoader[Any]:
    common: dict[str, Any] = {"num_workers": workers}
    if workers:
        common["persistent_workers"] = True
        common["multiprocessing_context"] = "fork"
    if mode == "ds.dataloader":
        return ds.dataloader(batch, shuffle=True, **common)
    collate_fn = collate if mode == "getitems+collate" else None
    return DataLoader(ds, batch_size=batch, shuffle=True, collate_fn=collate_fn, **common)


def epoch(loader: DataLoader[Any]) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    for x in loader:
        n += len(x)
    return time.perf_counter() - t0, n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    print(f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
          f"{os.cpu_count()} cpus, {platform.platform()}")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        out = Path(tmp) / "bench.tsc"
        paths = [f"covers/{i:07d}.jpg" for i in range(args.items)]
        tsc.build_store(paths, out, loader=random_vector, loader_id="bench.random/1",
                        workers=1, progress=False)
        print(f"store: {args.items} x 3x32x32 float32, batch {args.batch}, shuffled; "
              f"epoch items/s, median of {args.repeat}")
        print(f"| workers | {' | '.join(MODES)} |")
        print("|---|" + "---|" * len(MODES))
        for workers in args.workers:
            loaders = {}
            for mode in MODES:
                ds = (PerItem if mode == "per-item" else StoreDataset)(out)
                loaders[mode] = make_loader(mode, ds, args.batch, workers)
                epoch(loaders[mode])  # warm-up: start workers, fault pages in
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            for _ in range(args.repeat):  # interleaved, so load changes hit every mode
                for mode in MODES:
                    times[mode].append(epoch(loaders[mode])[0])
            cells = [f"{args.items / statistics.median(times[m]):,.0f}" for m in MODES]
            print(f"| {workers} | {' | '.join(cells)} |")
            sys.stdout.flush()
            del loaders

MODES = ["per-item", "getitems", "getitems+collate", "ds.dataloader"]

if __name__ == "__main__":
    main()
