"""Hugging Face ``datasets``: ``Features`` with ``Sequence`` for the titles, numpy format.

Built with ``Dataset.from_dict({"key": keys}).map(fn, batched=True, num_proc=2,
features=Features({"key": Value("string"), "image": ..., "title_ids":
Sequence(Value("int32")), "rating": Value("float32")}))`` and ``save_to_disk`` (the
map's cache files are deleted after); opened with ``load_from_disk(...)
.with_format("numpy")`` (memory-mapped Arrow). A record by key is ``ds[row]`` through a
key -> row dict made from the ``key`` column; a batch ``ds[rows]`` (titles come back as
an object array of arrays, padded by :func:`pad_rows`); the epoch
``ds.iter(batch_size=256)``.

The cover is stored as a fixed-size list of 3,072 uint8 (``List(Value("uint8"),
length=3072)``) and reshaped to ``(3, 32, 32)`` on read (``hf_datasets``): of the two
documented feature types for a fixed-shape tensor this is the faster here, as for the
float32 vectors of the main benchmark (:mod:`benchmarks.run.hf_features`).
``hf_datasets_array3d`` is the same method with ``Array3D``, to measure it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._base import Batch, IndexedReader, Reader, RecordMethod, pad_rows

IMAGE_SHAPE = (3, 32, 32)
FLAT = 3 * 32 * 32


def features(array3d: bool) -> Any:
    from datasets import Array3D, Features, List, Sequence, Value

    image = Array3D(IMAGE_SHAPE, "uint8") if array3d else List(Value("uint8"), length=FLAT)
    return Features({"key": Value("string"), "image": image,
                     "title_ids": Sequence(Value("int32")), "rating": Value("float32")})


class _Records:
    """``map`` function: a batch of keys in, their records out."""

    def __init__(self, loader: Callable[[str], dict[str, Any]], array3d: bool) -> None:
        self.loader = loader
        self.array3d = array3d

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, Any]:
        recs = [self.loader(k) for k in batch["key"]]
        images = np.stack([r["image"] for r in recs])
        return {"key": batch["key"],
                "image": images if self.array3d else images.reshape(len(recs), FLAT),
                "title_ids": [r["title_ids"] for r in recs],
                "rating": np.array([r["rating"] for r in recs], dtype=np.float32)}


def _titles(column: Any) -> np.ndarray:
    arr = np.asarray(column) if not isinstance(column, np.ndarray) else column
    if arr.dtype != object and arr.ndim == 2:  # every title of the batch equally long
        return arr.astype(np.int32, copy=False)
    return pad_rows(list(arr))


def _batch(b: Mapping[str, Any]) -> Batch:
    return Batch(b["image"].reshape(-1, *IMAGE_SHAPE), _titles(b["title_ids"]), b["rating"])


class HfReader(IndexedReader):
    """Rows in the order the map wrote them, read a batch at a time."""

    def key_map(self, keys: list[str]) -> None:
        stored = self.ds.with_format(None)["key"][:]  # one read (iterating reads row by row)
        self.index = {k: i for i, k in enumerate(stored)}
        self.rows = np.fromiter((self.index[k] for k in keys), dtype=np.int64, count=len(keys))

    def record(self, key: str) -> Mapping[str, Any]:
        row: dict[str, Any] = self.ds[self.index[key]]
        row["image"] = row["image"].reshape(IMAGE_SHAPE)
        return row

    def batch(self, rows: np.ndarray) -> Batch:
        return _batch(self.ds[self.rows[rows]])

    def epoch(self, batch_size: int) -> Iterator[Batch]:
        for b in self.ds.iter(batch_size=batch_size):
            yield _batch(b)


class HfDatasets(RecordMethod):
    modules = ("datasets",)
    packages = ("numpy", "datasets", "pyarrow")

    def __init__(self, *, array3d: bool) -> None:
        self.array3d = array3d
        self.name = "hf_datasets_array3d" if array3d else "hf_datasets"
        self.summary = ("Hugging Face datasets: map(num_proc=2) to Arrow, save_to_disk, numpy "
                        f"format; cover as {'Array3D' if array3d else 'a fixed-size list'}")

    def build(self, keys: list[str], out: Path, loader: Callable[[str], dict[str, Any]],
              workers: int, *, synthetic: bool = False) -> dict[str, Any]:
        import datasets

        datasets.disable_progress_bars()
        tmp = out.with_name(out.name + "-map")
        ds = datasets.Dataset.from_dict({"key": keys}).map(
            _Records(loader, self.array3d), batched=True, num_proc=workers,
            features=features(self.array3d),
            cache_file_name=str(tmp / "records.arrow"))
        ds.save_to_disk(str(out))
        del ds
        shutil.rmtree(tmp, ignore_errors=True)
        return {}

    def open(self, out: Path, built: dict[str, Any]) -> Reader:
        import datasets

        datasets.disable_progress_bars()
        return HfReader(datasets.load_from_disk(str(out)).with_format("numpy"))


METHOD = HfDatasets(array3d=False)
METHOD_ARRAY3D = HfDatasets(array3d=True)
