"""Seed method 3: the vector column dumped with ``torch.save``, loaded by every agent.

The cache key is the seed's ``pd.util.hash_pandas_object(paths).sum()`` and the file
``{workdir}/__pycache__/{key}.pt``. Unlike the seed, the vectors are computed in the
order of ``paths`` (the seed computed them over ``sorted(paths)`` and assigned them to
the unsorted frame, giving path i the vector of another image).

``torch.load(..., weights_only=False)`` is required to read back a pickled pandas
Series, and it is unsafe: unpickling runs arbitrary code stored in the cache file.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._base import PASS_BATCH, Column, Method, default_loader

UNSAFE_NOTE = (
    "torch_save: torch.load(..., weights_only=False) unpickles the cache file, "
    "which runs any code stored in it; torch >= 2.6 refuses such files by default"
)


def cache_key(paths: list[str]) -> int:
    """The seed's key: the sum of the per-row hashes of the path Series."""
    import pandas as pd

    return int(pd.util.hash_pandas_object(pd.Series(paths, name="img_path")).sum())


class TorchSaveColumn(Column):
    """The loaded Series, and a path -> vector dict built from it."""

    def __init__(self, paths: list[str], series: Any) -> None:
        super().__init__(paths)
        self.series = series
        self.vectors = list(series.to_numpy())
        self.by_path = dict(zip(paths, self.vectors, strict=True))

    def lookup(self, path: str) -> Any:
        return self.by_path[path]

    def item(self, i: int) -> Any:
        return self.vectors[i]

    def batch(self, rows: np.ndarray) -> np.ndarray:
        vectors = self.vectors
        return np.stack([vectors[r] for r in rows.tolist()])

    def full_pass(self, batch_size: int = PASS_BATCH) -> float:
        return float(sum(float(v.sum(dtype=np.float64)) for v in self.vectors))


class TorchSave(Method):
    name = "torch_save"
    summary = "seed method 3: torch.save of the vector Series, torch.load in every agent"
    modules = ("pandas", "torch")

    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        return {"cache_dir": str(workdir / "__pycache__")}

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        import pandas as pd
        import torch

        key = cache_key(paths)
        fpath = Path(state["cache_dir"]) / f"{key}.pt"
        if fpath.exists():
            t0 = time.perf_counter()
            series = torch.load(fpath, weights_only=False)  # unsafe: see UNSAFE_NOTE
            open_s = time.perf_counter() - t0
            column = TorchSaveColumn(paths, series)
            column.open_s, column.hit = open_s, True
            return column
        loader = loader or default_loader()
        data_box = [loader(p) for p in paths]
        series = pd.Series(data_box, name="img_vector")
        fpath.parent.mkdir(parents=True, exist_ok=True)
        torch.save(series, fpath)
        return TorchSaveColumn(paths, series)


METHOD = TorchSave()
