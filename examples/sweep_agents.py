"""A hyperparameter sweep whose agents share one store of image vectors.

Each agent is a fresh process calling ``main(args)``, as a wandb or Optuna
sweep starts them. The first agent to ask decodes the images once, into a
store in the cache directory; every later agent (and every agent running
at the same time, which waits for that one build) maps the same files and
has its vectors in milliseconds. Nothing is pickled through a manager, no
agent holds a private copy, and the cache key covers the preprocessing
(32 x 32 and 64 x 64 are different caches).

Run::

    python examples/sweep_agents.py                      # 2,000 generated covers, 4 agents
    python examples/sweep_agents.py --images data/images --agents 8 --parallel

Prints each agent's time to vectors.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

import tensorstore_cache as tsc


def make_covers(root: Path, n: int, seed: int = 0) -> list[str]:
    """Write ``n`` small JPEG "book covers" (random sizes and colours) under ``root``."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        h, w = int(rng.integers(60, 120)), int(rng.integers(40, 90))
        base = rng.integers(0, 256, 3)
        pixels = np.clip(base + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
        path = root / f"{i % 10:02d}" / f"{i:07d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(str(path))
    return paths


def ratings_table(paths: list[str], n_rows: int, seed: int) -> pd.DataFrame:
    """A ratings table like the seed's: several rows per cover, in no particular order."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "user_id": rng.integers(0, 1000, n_rows),
        "img_path": rng.choice(paths, n_rows),
        "rating": rng.integers(1, 11, n_rows).astype(np.float32),
    })


def main(args: argparse.Namespace) -> None:
    """One agent: get the vectors of every row, then fit a (tiny) model with its hyperparameter."""
    t0 = time.perf_counter()
    df = ratings_table(args.paths, args.rows, seed=0)  # the same data for every agent
    # The seed's process_img_data, replaced: computed once per machine, mapped by everyone.
    store = tsc.cached(df["img_path"], cache_dir=args.cache_dir, size=(32, 32),
                       workers=args.build_workers, progress=False)
    df["img_vector"] = store.series(df["img_path"])  # every row its own vector, no copy
    x = store.stack(df["img_path"]).reshape(len(df), -1)  # (rows, 3*32*32) for the model
    t_vectors = time.perf_counter() - t0

    # "Training": ridge regression of the rating on the mean colour, strength from the sweep.
    features = np.c_[x.reshape(len(df), 3, -1).mean(axis=2), np.ones(len(df))]
    y = df["rating"].to_numpy()
    w = np.linalg.solve(features.T @ features + args.alpha * np.eye(4), features.T @ y)
    rmse = float(np.sqrt(np.mean((features @ w - y) ** 2)))
    print(f"agent {args.agent} (pid {os.getpid()}): vectors for {len(df):,} rows "
          f"({df['img_path'].nunique():,} covers) in {t_vectors:.2f} s; alpha={args.alpha:g} "
          f"rmse={rmse:.3f}", flush=True)
    store.close()


def run_sweep(base: argparse.Namespace) -> None:
    """Start the agents as a sweep does: each one a new spawned process calling main(args)."""
    ctx = multiprocessing.get_context("spawn")
    agents = []
    for k in range(base.agents):
        args = argparse.Namespace(**vars(base), agent=k, alpha=10.0 ** (k - 2))
        agents.append(ctx.Process(target=main, args=(args,), name=f"agent-{k}"))
    t0 = time.perf_counter()
    if base.parallel:
        for p in agents:
            p.start()
        for p in agents:
            p.join()
    else:
        for p in agents:
            p.start()
            p.join()
    failed = [p.name for p in agents if p.exitcode != 0]
    if failed:
        raise SystemExit(f"agents failed: {', '.join(failed)}")
    print(f"{base.agents} agents done in {time.perf_counter() - t0:.2f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", help="a directory of images (default: generate --n covers)")
    ap.add_argument("--n", type=int, default=2000, help="covers to generate (default: 2000)")
    ap.add_argument("--rows", type=int, default=10_000, help="ratings rows per agent")
    ap.add_argument("--agents", type=int, default=4, help="agent processes (default: 4)")
    ap.add_argument("--parallel", action="store_true", help="start all agents at once")
    ap.add_argument("--cache-dir", help="cache directory (default: a temporary one)")
    ap.add_argument("--build-workers", type=int, default=None, help="processes for the one build")
    return ap.parse_args(argv)


if __name__ == "__main__":
    opts = parse_args()
    with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
        if opts.images:
            opts.paths = sorted(
                str(p) for p in Path(opts.images).rglob("*")
                if p.suffix.lower() in {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp"}
            )
        else:
            opts.paths = make_covers(Path(tmp) / "covers", opts.n)
        opts.cache_dir = opts.cache_dir or os.path.join(tmp, "cache")
        run_sweep(opts)
