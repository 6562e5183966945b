"""tensorstore_cache: a store of records, ``cached(..., fields=...)`` with 2 workers.

Built with ``tsc.cached(keys, loader=..., loader_id=..., fields=FIELDS, workers=2)``
(the synthetic open-time stores, whose keys are not files, with ``tsc.build_store`` and
``identity="none"``);
opened with ``tsc.open_store(store.location)``. A record by key is ``store[key]`` (a
``Record`` of views), a batch ``store.take(rows)`` with ``b["title_ids"].pad(value=0)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._base import Batch, Reader, RecordMethod


def fields() -> dict[str, Any]:
    import tensorstore_cache as tsc

    return {"image": tsc.Fixed((3, 32, 32), "uint8"), "title_ids": tsc.Ragged("int32"),
            "rating": tsc.Fixed((), "float32")}


class TscReader(Reader):
    def __init__(self, store: Any) -> None:
        self.store = store
        self.n = len(store)
        self.rows = np.arange(self.n)

    def first(self) -> Any:
        return self.store.take(np.zeros(1, dtype=np.int64))

    def key_map(self, keys: list[str]) -> None:
        self.rows = self.store.rows(keys)

    def record(self, key: str) -> Mapping[str, Any]:
        return self.store[key]  # type: ignore[no-any-return]

    def _batch(self, rows: np.ndarray) -> Batch:
        b = self.store.take(rows)
        return Batch(b["image"], b["title_ids"].pad(value=0), b["rating"])

    def batch(self, rows: np.ndarray) -> Batch:
        return self._batch(self.rows[rows])

    def epoch(self, batch_size: int) -> Iterator[Batch]:
        for start in range(0, self.n, batch_size):
            yield self._batch(np.arange(start, min(start + batch_size, self.n)))

    def close(self) -> None:
        self.store.close()


class TensorstoreCache(RecordMethod):
    name = "tensorstore_cache"
    summary = "this project: cached(fields=...) with 2 workers, open_store, take + pad"
    modules = ("tensorstore_cache",)
    packages = ("numpy", "tensorstore_cache", "zarr")

    def build(self, keys: list[str], out: Path, loader: Callable[[str], dict[str, Any]],
              workers: int, *, synthetic: bool = False) -> dict[str, Any]:
        import tensorstore_cache as tsc

        loader_id = getattr(loader, "loader_id", "benchmarks.records/1")
        if synthetic:
            store = tsc.build_store(keys, out / "records.tsc", loader=loader, loader_id=loader_id,
                                    fields=fields(), workers=workers, progress=False, identity="none")
        else:
            store = tsc.cached(keys, cache_dir=out, loader=loader, loader_id=loader_id,
                               fields=fields(), workers=workers, progress=False)
        with store:
            return {"location": store.location}

    def open(self, out: Path, built: dict[str, Any]) -> Reader:
        import tensorstore_cache as tsc

        return TscReader(tsc.open_store(built["location"]))


METHOD = TensorstoreCache()
