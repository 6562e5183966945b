"""Training-style iteration over a DataLoader that reads a store.

A tiny linear model learns to predict a cover's rating from its 3 x 32 x 32
pixels, for a few steps, with DataLoader workers that all map the one copy
of the vectors in the page cache (no worker holds its own copy, and a
batch is gathered with one read, not 256 ``__getitem__`` calls).

Run::

    python examples/dataloader.py                      # 4,000 generated covers
    python examples/dataloader.py --images data/images --workers 2 --steps 200
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import tensorstore_cache as tsc
from tensorstore_cache.torch import StoreDataset


def make_covers(root: Path, n: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Write ``n`` small PNG covers; the "rating" is how red a cover is (so it can be learnt)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths, ratings = [], np.empty(n, dtype=np.float32)
    for i in range(n):
        colour = rng.integers(0, 256, 3)
        pixels = np.clip(colour + rng.normal(0, 20, (48, 36, 3)), 0, 255).astype(np.uint8)
        path = root / f"{i % 16:02d}" / f"{i:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path)
        paths.append(str(path))
        ratings[i] = 1.0 + 9.0 * colour[0] / 255.0
    return paths, ratings


def train(store: tsc.CacheStore, paths: list[str], ratings: np.ndarray, args: argparse.Namespace) -> float:
    """Run ``args.steps`` optimisation steps; return the last loss."""
    torch.manual_seed(0)
    ds = StoreDataset(store, paths, targets=ratings)
    loader = ds.dataloader(args.batch, shuffle=True, drop_last=True, num_workers=args.workers,
                           persistent_workers=args.workers > 0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step, seen, loss = 0, 0, torch.tensor(float("nan"))
    t0 = time.perf_counter()
    while step < args.steps:
        for x, y in loader:  # x: (batch, 3, 32, 32) float32 in [0, 1]; y: (batch,)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step, seen = step + 1, seen + len(y)
            if step % max(1, args.steps // 5) == 0 or step == args.steps:
                print(f"step {step:4d}  loss {loss.item():8.3f}  "
                      f"{seen / (time.perf_counter() - t0):,.0f} items/s", flush=True)
            if step == args.steps:
                break
    return float(loss.item())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", help="a directory of images (default: generate --n covers)")
    ap.add_argument("--n", type=int, default=4000, help="covers to generate (default: 4000)")
    ap.add_argument("--steps", type=int, default=100, help="optimisation steps (default: 100)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default: 64)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (default: 2)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--cache-dir", help="cache directory (default: a temporary one)")
    ap.add_argument("--build-workers", type=int, default=None, help="processes for the one build")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dataloader-") as tmp:
        if args.images:
            paths = sorted(str(p) for p in Path(args.images).rglob("*.*")
                           if p.suffix.lower() in {".jpg", ".jpeg", ".png", ".bmp", ".webp"})
            ratings = np.random.default_rng(0).uniform(1, 10, len(paths)).astype(np.float32)
        else:
            paths, ratings = make_covers(Path(tmp) / "covers", args.n)
        t0 = time.perf_counter()
        store = tsc.cached(paths, cache_dir=args.cache_dir or Path(tmp) / "cache", size=(32, 32),
                           workers=args.build_workers)
        print(f"{len(store):,} vectors ready in {time.perf_counter() - t0:.2f} s")
        loss = train(store, paths, ratings, args)
        print(f"final loss {loss:.3f}")


if __name__ == "__main__":
    main()
