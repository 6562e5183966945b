"""zarr-python's own API over a tensorstore_cache store's ``vectors`` array.

The store is built as the ``tensorstore_cache`` method builds it; reads go through
``zarr.open_group(store, mode="r")["vectors"]``: ``z[i]`` per item, ``z.oindex[rows]``
per batch. Paths are mapped to rows with the store's own index.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._base import PASS_BATCH, Column, Method
from .tsc import open_or_build


class ZarrColumn(Column):
    def __init__(self, paths: list[str], z: Any, store: Any) -> None:
        super().__init__(paths)
        self.z = z
        self.index = store  # the tensorstore_cache store, used for its path index only
        self.rows = store.rows(paths)

    def lookup(self, path: str) -> Any:
        return self.z[int(self.index.rows([path])[0])]

    def item(self, i: int) -> Any:
        return self.z[int(self.rows[i])]

    def batch(self, rows: np.ndarray) -> np.ndarray:
        return self.z.oindex[self.rows[rows]]

    def full_pass(self, batch_size: int = PASS_BATCH) -> float:
        total = 0.0
        n = self.z.shape[0]
        for start in range(0, n, batch_size):
            total += float(self.z[start : min(n, start + batch_size)].sum(dtype=np.float64))
        return total

    def close(self) -> None:
        self.index.close()


class ZarrApi(Method):
    name = "zarr_api"
    summary = "zarr-python API (z[i], z.oindex) over the same store's vectors array"
    modules = ("zarr", "tensorstore_cache")

    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        return {"cache_dir": str(workdir / "covers.tsc")}

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        import zarr

        store, open_s = open_or_build(state["cache_dir"], paths, loader)
        t0 = time.perf_counter()
        z = zarr.open_group(state["cache_dir"], mode="r")["vectors"]
        zarr_open_s = time.perf_counter() - t0
        column = ZarrColumn(paths, z, store)
        if open_s is not None:
            column.open_s, column.hit = open_s + zarr_open_s, True
        return column


METHOD = ZarrApi()
