"""The limit: one flat file of N x 3 x 32 x 32 float32 read through ``np.memmap``.

No format, no checks, no index file beyond a JSON list of paths: lookups go through a
path -> row dict built in the agent, batches are a fancy-index gather on the memmap.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ._base import ITEM_SHAPE, PASS_BATCH, Column, Method, default_loader


def _open(filename: str | os.PathLike[str], n: int) -> np.ndarray:
    """Copy-on-write memmap of the file, as a plain ndarray view (no memmap overhead)."""
    data = np.memmap(filename, dtype=np.float32, mode="c", shape=(n, *ITEM_SHAPE))
    return data.view(np.ndarray)


class RawColumn(Column):
    def __init__(self, paths: list[str], data: np.ndarray, stored: list[str], filename: str) -> None:
        super().__init__(paths)
        self.data = data
        self.filename = filename
        self.row_of = {p: i for i, p in enumerate(stored)}
        self.rows = np.fromiter((self.row_of[p] for p in paths), dtype=np.int64, count=len(paths))

    def lookup(self, path: str) -> Any:
        return self.data[self.row_of[path]]

    def item(self, i: int) -> Any:
        return self.data[self.rows[i]]

    def batch(self, rows: np.ndarray) -> np.ndarray:
        return self.data[self.rows[rows]]

    def full_pass(self, batch_size: int = PASS_BATCH) -> float:
        total = 0.0
        for start in range(0, self.n, batch_size):
            total += float(self.data[start : start + batch_size].sum(dtype=np.float64))
        return total

    def dataset(self) -> Any:
        # a path and an index array: nothing for fork to copy page by page, and the
        # memmap is opened in each worker (pickling a memmap would copy the data)
        return RawDataset(self.filename, len(self.data), self.rows)


class RawDataset:
    """Holds the file name and opens the memmap lazily in each DataLoader worker."""

    def __init__(self, filename: str, n: int, rows: np.ndarray) -> None:
        self.filename, self.n, self.rows = filename, n, rows
        self._data: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        if self._data is None:
            self._data = _open(self.filename, self.n)
        return self._data[self.rows[i]]

    def __getitems__(self, indices: list[int]) -> np.ndarray:
        if self._data is None:
            self._data = _open(self.filename, self.n)
        return self._data[self.rows[np.asarray(indices, dtype=np.int64)]]


class RawMemmap(Method):
    name = "raw_memmap"
    summary = "the limit: np.memmap over one flat float32 file, path->row dict"

    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        shutil.rmtree(workdir, ignore_errors=True)
        (workdir / "raw").mkdir(parents=True)
        return {"cache_dir": str(workdir / "raw")}

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        cache = Path(state["cache_dir"])
        data_file, paths_file = cache / "vectors.f32", cache / "paths.json"
        if paths_file.exists():
            t0 = time.perf_counter()
            stored = json.loads(paths_file.read_text())
            data = _open(data_file, len(stored))
            open_s = time.perf_counter() - t0
            column = RawColumn(paths, data, stored, str(data_file))
            column.open_s, column.hit = open_s, True
            return column
        loader = loader or default_loader()
        tmp = cache / "vectors.f32.tmp"
        out = np.memmap(tmp, dtype=np.float32, mode="w+", shape=(len(paths), *ITEM_SHAPE))
        for i, p in enumerate(paths):
            out[i] = loader(p)
        out.flush()
        del out
        os.replace(tmp, data_file)
        (cache / "paths.json.tmp").write_text(json.dumps(paths))
        os.replace(cache / "paths.json.tmp", paths_file)
        data = _open(data_file, len(paths))
        return RawColumn(paths, data, list(paths), str(data_file))


METHOD = RawMemmap()
