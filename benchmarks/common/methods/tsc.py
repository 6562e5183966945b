"""tensorstore_cache: build once with 2 workers, open the memory-mapped store elsewhere.

The first agent calls ``tsc.build_store(paths, out, size=(32, 32), workers=2)``; later
agents ``tsc.open_store(out)``. Lookups are ``store[path]`` (a view of the mapped
file), batches ``store.take(rows)`` with rows from one ``store.rows(paths)`` call.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._base import PASS_BATCH, SIZE, Column, Method

WORKERS = 2


def open_or_build(out: str, paths: list[str], loader: Any) -> tuple[Any, float | None]:
    """Open the store at ``out``, or build it; return ``(store, open seconds or None)``."""
    import tensorstore_cache as tsc

    t0 = time.perf_counter()
    try:
        store = tsc.open_store(out)
    except tsc.StoreNotFoundError:
        pass
    else:
        return store, time.perf_counter() - t0
    kwargs: dict[str, Any] = {"workers": WORKERS, "progress": False}
    if loader is None:
        kwargs["size"] = SIZE
    else:  # the synthetic loader of the open-time rounds: keys are not files; it has its size
        kwargs["loader"] = loader
        kwargs["loader_id"] = loader.loader_id
        kwargs["identity"] = "none"
    return tsc.build_store(paths, out, **kwargs), None


class TscColumn(Column):
    def __init__(self, paths: list[str], store: Any) -> None:
        super().__init__(paths)
        self.store = store
        self.rows = store.rows(paths)

    def lookup(self, path: str) -> Any:
        return self.store[path]

    def batch(self, rows: np.ndarray) -> np.ndarray:
        return self.store.take(self.rows[rows])

    def full_pass(self, batch_size: int = PASS_BATCH) -> float:
        out = np.empty((batch_size, *self.store.spec.item_shape), dtype=self.store.dtype)
        total = 0.0
        for start in range(0, self.n, batch_size):
            rows = self.rows[start : start + batch_size]
            got = self.store.take(rows, out=out[: len(rows)])
            total += float(got.sum(dtype=np.float64))
        return total

    def dataloader(self, batch_size: int, num_workers: int, context: Any) -> Any:
        # the library's documented DataLoader: whole batches, one take() each
        from tensorstore_cache.torch import StoreDataset

        return StoreDataset(self.store, self.paths).dataloader(
            batch_size, shuffle=True, num_workers=num_workers, multiprocessing_context=context
        )

    def close(self) -> None:
        self.store.close()


class TensorstoreCache(Method):
    name = "tensorstore_cache"
    summary = "this project: zarr v3 store built once (2 workers), mmap'd zero-copy by every agent"
    modules = ("tensorstore_cache",)

    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        return {"cache_dir": str(workdir / "covers.tsc")}

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        store, open_s = open_or_build(state["cache_dir"], paths, loader)
        column = TscColumn(paths, store)
        if open_s is not None:
            column.open_s, column.hit = open_s, True
        return column


METHOD = TensorstoreCache()
