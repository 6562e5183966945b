"""How fast a DataLoader epoch over a StoreDataset is: batching, augmentation, the order.

Run ``python -m benchmarks.torch_batching [--items N] [--batch B] [--workers W]
[--only batching augment permutation] [--out NAME]``. Its tables are printed and written,
with every figure, to ``benchmarks/results/torch_batching/torch_batching.json`` and ``.md``,
stamped with the run (``--results DIR``, ``--out NAME`` write them elsewhere).

**batching.** Builds a store of ``N`` random ``3 x 32 x 32`` float32 vectors (a
synthetic loader, no images), then times shuffled epochs (median of
``--repeat``, after one warm-up epoch; persistent workers, so worker start-up
is not counted):

- ``per-item``: ``__getitems__`` hidden, the loader calls ``ds[i]`` per item and
  torch's default collate stacks them (what a plain map-style dataset gets);
- ``getitems``: ``DataLoader(ds, batch_size=B)``: one ``store.take`` per batch,
  then default collate stacks the samples again;
- ``getitems+collate``: the same with ``collate_fn=tensorstore_cache.torch.collate``,
  which returns the gathered batch without stacking again;
- ``ds.dataloader``: ``ds.dataloader(B, shuffle=True)``, a ``DataLoader`` with a
  ``BatchSampler`` that gathers each batch at once (in workers: straight into
  shared memory).

**augment.** The same on a store of ``uint8`` pixels read ``as_float``, with a
random augmentation: ``batch_transform=`` (once per gathered ``uint8`` batch,
vectorised: ``RandomFlipCrop(pad=4)``, then also ``ColorJitter``) against the
same augmentation written as a per-item ``transform=`` (one call per item on
its ``3 x 32 x 32`` tensor, then the batch is stacked again); the ratio of
epoch throughputs (target >= 5x).

**permutation.** Time to compute one epoch's order with :class:`StoreSampler`
(splitmix64 and a sort, the same on every machine) at ``--perm-sizes`` rows,
beside ``torch.randperm`` and numpy's ``Generator.permutation`` (neither is
guaranteed across machines or builds); median of ``--repeat``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

import tensorstore_cache as tsc
from benchmarks.common._record import Record, add_results_options
from tensorstore_cache.torch import (
    ColorJitter,
    Compose,
    RandomFlipCrop,
    StoreDataset,
    StoreLoader,
    StoreSampler,
    collate,
)


def _seed_of(path: str) -> int:
    return int.from_bytes(path.encode()[-8:].rjust(8, b"\0"), "little")


def random_vector(path: str) -> np.ndarray:
    """A cheap deterministic loader: random float32 values seeded by the path."""
    return np.random.default_rng(_seed_of(path)).random((3, 32, 32), dtype=np.float32)


def random_pixels(path: str) -> np.ndarray:
    """A cheap deterministic loader of uint8 pixels."""
    return np.random.default_rng(_seed_of(path)).integers(0, 256, (3, 32, 32), dtype=np.uint8)


def flip_crop_item(x: torch.Tensor) -> torch.Tensor:
    """The per-item equivalent of ``RandomFlipCrop(pad=4)`` on one ``(3, H, W)`` item."""
    if float(torch.rand(())) < 0.5:
        x = x.flip(-1)
    h, w = x.shape[1:]
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    i, j = torch.randint(0, 9, (2,)).tolist()
    return padded[:, i : i + h, j : j + w]


_GRAY = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)


def jitter_item(x: torch.Tensor) -> torch.Tensor:
    """The per-item equivalent of ``ColorJitter(0.2, 0.2)`` on one float item in ``[0, 1]``."""
    b, c = (0.8 + 0.4 * torch.rand(2)).tolist()
    y = (x * b).clamp_(0, 1)
    mean = (y * _GRAY).sum(0).mean()
    out: torch.Tensor = ((y - mean) * c + mean).clamp_(0, 1)
    return out


def flip_crop_jitter_item(x: torch.Tensor) -> torch.Tensor:
    return jitter_item(flip_crop_item(x))


AUGMENTATIONS: dict[str, tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "flip+crop": (RandomFlipCrop(pad=4), flip_crop_item),
    "flip+crop+jitter": (Compose([RandomFlipCrop(pad=4), ColorJitter(0.2, 0.2)]),
                         flip_crop_jitter_item),
}


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


def batching(args: argparse.Namespace, tmp: str, record: Record) -> None:
    out = Path(tmp) / "bench.tsc"
    paths = [f"covers/{i:07d}.jpg" for i in range(args.items)]
    tsc.build_store(paths, out, loader=random_vector, loader_id="bench.random/1",
                    workers=1, progress=False, identity="none")
    record.print(f"store: {args.items} x 3x32x32 float32, batch {args.batch}, shuffled; "
                 f"epoch items/s, median of {args.repeat}")
    record.print(f"| workers | {' | '.join(MODES)} |")
    record.print("|---|" + "---|" * len(MODES))
    figures = record.figures.setdefault("batching_items_per_s", {})
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
        rates = {m: args.items / statistics.median(times[m]) for m in MODES}
        figures[str(workers)] = rates
        record.print(f"| {workers} | {' | '.join(f'{rates[m]:,.0f}' for m in MODES)} |")
        del loaders


def augment(args: argparse.Namespace, tmp: str, record: Record) -> None:
    out = Path(tmp) / "pixels.tsc"
    paths = [f"covers/{i:07d}.jpg" for i in range(args.items)]
    tsc.build_store(paths, out, loader=random_pixels, loader_id="bench.pixels/1", dtype="uint8",
                    workers=1, progress=False, identity="none")
    record.print()
    record.print(f"store: {args.items} x 3x32x32 uint8 read as_float, batch {args.batch}, "
                 f"shuffled; epoch items/s, median of {args.repeat}")
    record.print("| augmentation | workers | per-item transform= | batch_transform= | ratio |")
    record.print("|---|---|---|---|---|")
    figures = record.figures.setdefault("augment_items_per_s", {})
    for name, (batched, per_item) in AUGMENTATIONS.items():
        for workers in args.workers:
            common: dict[str, Any] = {"num_workers": workers}
            if workers:
                common.update(persistent_workers=True, multiprocessing_context="fork")
            loaders: dict[str, StoreLoader] = {
                "item": StoreDataset(out, transform=per_item, as_float=True).dataloader(
                    args.batch, shuffle=True, **common),
                "batch": StoreDataset(out, as_float=True).dataloader(
                    args.batch, shuffle=True, batch_transform=batched, **common),
            }
            for lo in loaders.values():
                epoch(lo)  # warm-up
            times: dict[str, list[float]] = {k: [] for k in loaders}
            for _ in range(args.repeat):
                for k, lo in loaders.items():
                    times[k].append(epoch(lo)[0])
            rate = {k: args.items / statistics.median(v) for k, v in times.items()}
            figures.setdefault(name, {})[str(workers)] = rate
            record.print(f"| {name} | {workers} | {rate['item']:,.0f} | {rate['batch']:,.0f} | "
                         f"{rate['batch'] / rate['item']:.1f}x |")
            del loaders


def permutation(args: argparse.Namespace, record: Record) -> None:
    record.print()
    record.print(f"one epoch's order, median of {args.repeat} (ms)")
    record.print("| rows | StoreSampler.permutation | torch.randperm | "
                 "numpy Generator.permutation |")
    record.print("|---|---|---|---|")
    figures = record.figures.setdefault("permutation_s", {})
    for n in args.perm_sizes:
        def ours(n: int = n) -> object:
            return StoreSampler(n, global_batch_size=1, seed=0).permutation(3)

        def torch_perm(n: int = n) -> object:
            return torch.randperm(n, generator=torch.Generator().manual_seed(3))

        def numpy_perm(n: int = n) -> object:
            return np.random.default_rng(3).permutation(n)

        medians = {}
        for key, fn in (("store_sampler", ours), ("torch_randperm", torch_perm),
                        ("numpy_permutation", numpy_perm)):
            fn()  # warm-up
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            medians[key] = statistics.median(times)
        figures[str(n)] = medians
        record.print(f"| {n:,} | {' | '.join(f'{m * 1e3:,.1f}' for m in medians.values())} |")


def main(argv: list[str] | None = None) -> None:
    """Run the sections asked for; print their tables and save them, stamped."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--perm-sizes", type=int, nargs="+", default=[181_777, 10_000_000])
    ap.add_argument("--only", nargs="+", choices=["batching", "augment", "permutation"],
                    default=["batching", "augment", "permutation"])
    ap.add_argument("--workdir", default=None)
    add_results_options(ap, "torch_batching")
    args = ap.parse_args(argv)
    record = Record("benchmarks.torch_batching", argv, results=args.results, name=args.out)
    record.config = {k: v for k, v in vars(args).items() if k not in ("results", "out")}
    record.print(f"torch {torch.__version__}, numpy {np.__version__}, {record.env['platform']}; "
                 "torch.set_num_threads(1)")
    torch.set_num_threads(1)  # as in DataLoader workers; two threads thrash on a busy 2-core machine
    if args.workdir is not None:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        if "batching" in args.only:
            batching(args, tmp, record)
        if "augment" in args.only:
            augment(args, tmp, record)
    if "permutation" in args.only:
        permutation(args, record)
    record.save(workdir=args.workdir)


MODES = ["per-item", "getitems", "getitems+collate", "ds.dataloader"]

if __name__ == "__main__":
    main()
