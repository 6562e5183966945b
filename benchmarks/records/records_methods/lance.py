"""Lance (``pylance``): the random-access columnar format, through its own Python API.

Built by a ``multiprocessing`` pool of 2 decoding in order (the loader sent once to each
worker, as for the numpy limit) while this process hands the records, 1,024 at a time, as
Arrow record batches to one ``lance.write_dataset`` (schema: ``key`` string, ``image`` a
fixed-size list of 3,072 uint8, ``title_ids`` a list of int32, ``rating`` float32).
Opened with ``lance.dataset(path)``. A record by key is ``ds.take([row])`` through a
key -> row dict made from the ``key`` column (as for datasets: Lance's own filter on a
scalar index costs a query plan per call); a batch ``ds.take(rows)``, the titles padded
from the list array's offsets and values in one gather; the epoch
``ds.to_batches(batch_size=256)``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._base import Batch, Reader, RecordMethod
from .numpy_limit import _load, _set_loader, padded_gather

IMAGE_SHAPE = (3, 32, 32)
FLAT = 3 * 32 * 32
CHUNK = 1024
COLUMNS = ["image", "title_ids", "rating"]


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([("key", pa.string()), ("image", pa.list_(pa.uint8(), FLAT)),
                      ("title_ids", pa.list_(pa.int32())), ("rating", pa.float32())])


def _record_batches(keys: list[str], records: Iterator[dict[str, Any]]) -> Iterator[Any]:
    import pyarrow as pa

    schema = _schema()
    for start in range(0, len(keys), CHUNK):
        part = keys[start : start + CHUNK]
        recs = [next(records) for _ in part]
        images = np.stack([r["image"] for r in recs]).reshape(-1)
        ids = [np.ascontiguousarray(r["title_ids"], dtype=np.int32) for r in recs]
        offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum([len(i) for i in ids], out=offsets[1:])
        titles = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(ids)))
        yield pa.record_batch(
            [pa.array(part, pa.string()), pa.FixedSizeListArray.from_arrays(images, FLAT),
             titles, pa.array(np.array([r["rating"] for r in recs], dtype=np.float32))],
            schema=schema)


def _to_batch(table: Any) -> Batch:
    """A :class:`Batch` of an Arrow table or record batch of the three columns."""
    image = table.column("image")
    image = image.combine_chunks() if hasattr(image, "combine_chunks") else image
    images = image.flatten().to_numpy(zero_copy_only=False).reshape(-1, *IMAGE_SHAPE)
    titles = table.column("title_ids")
    titles = titles.combine_chunks() if hasattr(titles, "combine_chunks") else titles
    offsets = titles.offsets.to_numpy()  # into values, which a slice may not start at 0
    values = titles.values.to_numpy(zero_copy_only=False)
    rows = np.arange(len(offsets) - 1)
    padded = padded_gather(values, offsets.astype(np.int64), rows) if len(rows) else \
        np.zeros((0, 0), np.int32)
    rating = table.column("rating").to_numpy(zero_copy_only=False)
    return Batch(images, padded, rating)


class LanceReader(Reader):
    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self.n = ds.count_rows()
        self.rows = np.arange(self.n)
        self.index: dict[str, int] = {}

    def first(self) -> Any:
        return self.ds.take([0], columns=COLUMNS)

    def key_map(self, keys: list[str]) -> None:
        stored = self.ds.to_table(columns=["key"]).column("key").to_pylist()
        self.index = {k: i for i, k in enumerate(stored)}
        self.rows = np.fromiter((self.index[k] for k in keys), dtype=np.int64, count=len(keys))

    def record(self, key: str) -> Mapping[str, Any]:
        t = self.ds.take([self.index[key]], columns=COLUMNS)
        image = t.column("image").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        ids = t.column("title_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        return {"image": image.reshape(IMAGE_SHAPE), "title_ids": ids,
                "rating": t.column("rating").to_numpy(zero_copy_only=False)[0]}

    def batch(self, rows: np.ndarray) -> Batch:
        return _to_batch(self.ds.take(self.rows[rows], columns=COLUMNS))

    def epoch(self, batch_size: int) -> Iterator[Batch]:
        for b in self.ds.to_batches(batch_size=batch_size, columns=COLUMNS):
            yield _to_batch(b)


class Lance(RecordMethod):
    name = "lance"
    summary = "Lance (pylance): write_dataset from a pool of 2 decoders, take + pad"
    modules = ("lance", "pyarrow")
    packages = ("numpy", "pylance", "pyarrow")

    def build(self, keys: list[str], out: Path, loader: Callable[[str], dict[str, Any]],
              workers: int, *, synthetic: bool = False) -> dict[str, Any]:
        # the decoders are forked before lance starts its threads in this process
        with multiprocessing.get_context("fork").Pool(
                workers, initializer=_set_loader, initargs=(loader,)) as pool:
            import lance
            import pyarrow as pa

            records = pool.imap(_load, keys, chunksize=64)
            reader = pa.RecordBatchReader.from_batches(_schema(), _record_batches(keys, records))
            lance.write_dataset(reader, str(out), mode="create")
        return {}

    def open(self, out: Path, built: dict[str, Any]) -> Reader:
        import lance

        return LanceReader(lance.dataset(str(out)))


METHOD = Lance()
