"""The limit: plain numpy memmaps of values and offsets, written by hand.

``images.u8`` (N, 3, 32, 32), ``title_values.i32`` (every title's ids end to end),
``title_offsets.i64`` (N + 1), ``ratings.f32`` (N) and ``keys.txt``; no format, no
checks. Built by a ``multiprocessing`` pool of 2 decoding in order (the loader sent once
to each worker) while this process writes. Opening maps the four files (no read of them).
A record by key is a dict lookup and three views; a batch is one fancy index per field,
the titles gathered through an index of offsets built without a loop per row.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._base import Batch, Reader, RecordMethod

IMAGE_SHAPE = (3, 32, 32)
_LOADER: list[Callable[[str], dict[str, Any]]] = []


def _set_loader(loader: Callable[[str], dict[str, Any]]) -> None:
    _LOADER[:] = [loader]


def _load(key: str) -> dict[str, Any]:
    return _LOADER[0](key)


def _map(path: Path, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only memmap as a plain ndarray view (no memmap overhead per index)."""
    if 0 in shape:  # mmap cannot map an empty file
        empty: np.ndarray = np.zeros(shape, dtype=dtype)
        return empty
    view: np.ndarray = np.memmap(path, dtype=dtype, mode="r", shape=shape).view(np.ndarray)
    return view


def padded_gather(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``(B, Lmax)`` of the ragged rows ``rows``, padded with 0, in one gather."""
    start, stop = offsets[rows], offsets[rows + 1]
    lengths = stop - start
    width = int(lengths.max()) if len(rows) else 0
    cols = np.arange(width)
    out: np.ndarray = np.take(values, start[:, None] + cols, mode="clip")
    out[cols >= lengths[:, None]] = 0
    return out


class LimitReader(Reader):
    def __init__(self, out: Path) -> None:
        self.out = out
        self.n = (out / "title_offsets.i64").stat().st_size // 8 - 1
        self.offsets = _map(out / "title_offsets.i64", "int64", (self.n + 1,))
        self.images = _map(out / "images.u8", "uint8", (self.n, *IMAGE_SHAPE))
        self.values = _map(out / "title_values.i32", "int32", (int(self.offsets[-1]),))
        self.ratings = _map(out / "ratings.f32", "float32", (self.n,))
        self.rows = np.arange(self.n)
        self.index: dict[str, int] = {}

    def first(self) -> Any:
        return self.batch(np.zeros(1, dtype=np.int64))

    def key_map(self, keys: list[str]) -> None:
        stored = (self.out / "keys.txt").read_text(encoding="utf-8").splitlines()
        self.index = {k: i for i, k in enumerate(stored)}
        self.rows = np.fromiter((self.index[k] for k in keys), dtype=np.int64, count=len(keys))

    def record(self, key: str) -> Mapping[str, Any]:
        i = self.index[key]
        o = self.offsets
        return {"image": self.images[i], "title_ids": self.values[o[i] : o[i + 1]],
                "rating": self.ratings[i]}

    def _batch(self, rows: np.ndarray) -> Batch:
        return Batch(self.images[rows], padded_gather(self.values, self.offsets, rows),
                     self.ratings[rows])

    def batch(self, rows: np.ndarray) -> Batch:
        return self._batch(self.rows[rows])

    def epoch(self, batch_size: int) -> Iterator[Batch]:
        for start in range(0, self.n, batch_size):
            yield self._batch(np.arange(start, min(start + batch_size, self.n)))


class NumpyLimit(RecordMethod):
    name = "numpy_limit"
    summary = "the limit: numpy memmaps of values + offsets written by hand, a key dict"

    def build(self, keys: list[str], out: Path, loader: Callable[[str], dict[str, Any]],
              workers: int, *, synthetic: bool = False) -> dict[str, Any]:
        out.mkdir(parents=True, exist_ok=True)
        n = len(keys)
        images = np.memmap(out / "images.u8", dtype=np.uint8, mode="w+",
                           shape=(max(n, 1), *IMAGE_SHAPE))
        offsets = np.zeros(n + 1, dtype=np.int64)
        ratings = np.zeros(n, dtype=np.float32)
        with open(out / "title_values.i32", "wb") as values, \
                multiprocessing.get_context("fork").Pool(
                    workers, initializer=_set_loader, initargs=(loader,)) as pool:
            for i, rec in enumerate(pool.imap(_load, keys, chunksize=64)):
                images[i] = rec["image"]
                ids = np.ascontiguousarray(rec["title_ids"], dtype=np.int32)
                values.write(ids.tobytes())
                offsets[i + 1] = offsets[i] + len(ids)
                ratings[i] = rec["rating"]
        images.flush()
        del images
        offsets.tofile(out / "title_offsets.i64")
        ratings.tofile(out / "ratings.f32")
        (out / "keys.txt").write_text("".join(k + "\n" for k in keys), encoding="utf-8")
        return {}

    def open(self, out: Path, built: dict[str, Any]) -> Reader:
        return LimitReader(out)


METHOD = NumpyLimit()
