"""Hugging Face ``datasets``: ``Dataset.map`` to an Arrow cache file, numpy format.

The first agent runs ``Dataset.from_dict({"img_path": paths}).map(fn, batched=True,
num_proc=2, cache_file_name=...)``; a later agent runs the same code and ``map`` finds
the cache files and memory-maps them. Items are looked up by path through a path -> row
dict built in the agent; batches are ``ds[rows]``.

The vector is stored as a fixed-size list of 3,072 float32 (``List(Value("float32"),
length=3072)``) and reshaped to ``(3, 32, 32)`` on read: of the two documented feature
types for a fixed-shape tensor this is the faster one here (``Array3D`` read single items
3.0x and batches of 256 11.7x slower in ``python -m benchmarks.run.hf_features``:
``benchmarks/results/run/hf-features.md``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._base import ITEM_SHAPE, PASS_BATCH, Column, Method, default_loader

FLAT = int(np.prod(ITEM_SHAPE))

NUM_PROC = 2


class _Vectorize:
    """``map`` function: a batch of paths in, their vectors out."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, Any]:
        vectors = np.stack([self.loader(p) for p in batch["img_path"]])
        return {"vector": vectors.reshape(len(vectors), FLAT)}


class HfColumn(Column):
    def __init__(self, paths: list[str], ds: Any) -> None:
        super().__init__(paths)
        self.ds = ds
        self.vec = ds.with_format("numpy", columns=["vector"])
        row_of = {p: i for i, p in enumerate(ds["img_path"])}
        self.row_of = row_of
        self.rows = np.fromiter((row_of[p] for p in paths), dtype=np.int64, count=len(paths))

    def lookup(self, path: str) -> Any:
        return self.vec[self.row_of[path]]["vector"].reshape(ITEM_SHAPE)

    def item(self, i: int) -> Any:
        return self.vec[int(self.rows[i])]["vector"].reshape(ITEM_SHAPE)

    def batch(self, rows: np.ndarray) -> np.ndarray:
        return self.vec[self.rows[rows]]["vector"].reshape(-1, *ITEM_SHAPE)

    def dataloader(self, batch_size: int, num_workers: int, context: Any) -> Any:
        # the library's documented way: the formatted Dataset itself in a DataLoader
        from torch.utils.data import DataLoader

        return DataLoader(self.vec, batch_size=batch_size, shuffle=True,
                          num_workers=num_workers, multiprocessing_context=context)

    def full_pass(self, batch_size: int = PASS_BATCH) -> float:
        total = 0.0
        for start in range(0, self.n, batch_size):
            total += float(self.vec[start : start + batch_size]["vector"].sum(dtype=np.float64))
        return total


class HfDatasets(Method):
    name = "hf_datasets"
    summary = "Hugging Face datasets: map() to an Arrow cache, numpy format"
    modules = ("datasets",)

    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        shutil.rmtree(workdir, ignore_errors=True)
        (workdir / "hf").mkdir(parents=True)
        return {"cache_dir": str(workdir / "hf")}

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        import datasets
        from datasets import Dataset, Features, Value

        try:
            from datasets import List  # datasets >= 4
        except ImportError:  # older datasets name it Sequence
            from datasets import Sequence as List

        datasets.disable_progress_bars()
        cache_file = str(Path(state["cache_dir"]) / "vectors.arrow")
        hit = any(Path(state["cache_dir"]).glob("vectors*.arrow"))
        features = Features(
            {"img_path": Value("string"), "vector": List(Value("float32"), length=FLAT)}
        )
        t0 = time.perf_counter()
        ds = Dataset.from_dict({"img_path": paths}).map(
            _Vectorize(loader or default_loader()),
            batched=True,
            num_proc=NUM_PROC,
            features=features,
            cache_file_name=cache_file,
        )
        open_s = time.perf_counter() - t0
        column = HfColumn(paths, ds)
        if hit:
            column.open_s, column.hit = open_s, True
        return column


METHOD = HfDatasets()
