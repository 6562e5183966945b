"""litData: ``optimize`` with 2 workers, read with ``StreamingDataset`` from the local folder.

Built with ``litdata.optimize(fn, inputs=keys, output_dir=..., num_workers=2,
chunk_bytes="64MB", keep_data_ordered=True, reorder_files=False)`` (``fn`` returns the
record as a dict: one serialized leaf per field). litData reads one item per call: a
record by key is ``ds[i]`` through a key -> index dict, a batch ``[ds[i] for i in rows]``
stacked and padded, both on ``StreamingDataset(input_dir=..., batch_decode=False)``; the
epoch iterates ``StreamingDataset(input_dir=...)`` and groups 256 items. (Its default
``batch_decode="auto"`` decodes a window of some 250 items at each random access: 11 ms
an item here, against 0.09 ms with ``False``; iterating is faster with the default.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._base import Batch, Reader, RecordMethod, batches_of, stack_records


class _Record:
    """``optimize`` function: a key in, its record (with the key) out."""

    def __init__(self, loader: Callable[[str], dict[str, Any]]) -> None:
        self.loader = loader

    def __call__(self, key: str) -> dict[str, Any]:
        rec = self.loader(key)
        # the key as bytes: litData stores a str that ends in ".jpg" as the bytes of the
        # image file it names; the rating as a 0-d array (its numpy serializer keeps float32)
        return {"key": key.encode(), "image": rec["image"], "title_ids": rec["title_ids"],
                "rating": np.asarray(rec["rating"], dtype=np.float32)}


class LitReader(Reader):
    def __init__(self, ds: Any, input_dir: str) -> None:
        self.ds = ds
        self.input_dir = input_dir
        self.n = len(ds)
        self.rows = np.arange(self.n)
        self.index: dict[str, int] = {}

    def first(self) -> Any:
        return self.ds[0]

    def key_map(self, keys: list[str]) -> None:
        # stored in input order (keep_data_ordered); the benchmark checks every record's
        # fields against the numpy limit's
        self.index = {k: i for i, k in enumerate(keys)}
        self.rows = np.arange(len(keys))

    def record(self, key: str) -> Mapping[str, Any]:
        return self.ds[self.index[key]]  # type: ignore[no-any-return]

    def batch(self, rows: np.ndarray) -> Batch:
        ds = self.ds
        return stack_records([ds[i] for i in self.rows[rows].tolist()])

    def epoch(self, batch_size: int) -> Iterator[Batch]:
        from litdata import StreamingDataset

        return batches_of(iter(StreamingDataset(input_dir=self.input_dir)), batch_size)


class LitData(RecordMethod):
    name = "litdata"
    summary = "litData: optimize(num_workers=2) to chunks, StreamingDataset over the local folder"
    modules = ("litdata",)
    packages = ("numpy", "litdata", "torch")

    def build(self, keys: list[str], out: Path, loader: Callable[[str], dict[str, Any]],
              workers: int, *, synthetic: bool = False) -> dict[str, Any]:
        from litdata import optimize

        optimize(fn=_Record(loader), inputs=keys, output_dir=str(out), num_workers=workers,
                 chunk_bytes="64MB", keep_data_ordered=True, reorder_files=False,
                 verbose=False)
        return {}

    def open(self, out: Path, built: dict[str, Any]) -> Reader:
        from litdata import StreamingDataset

        return LitReader(StreamingDataset(input_dir=str(out), batch_decode=False), str(out))


METHOD = LitData()
