"""MosaicML streaming: ``MDSWriter`` in 2 processes, ``merge_index``, a local ``StreamingDataset``.

Built as the library documents parallel conversion: a ``multiprocessing`` pool of 2,
each process writing its contiguous half of the keys with its own ``MDSWriter(out=part,
columns={"key": "str", "image": "ndarray:uint8:3,32,32", "title_ids": "ndarray:int32",
"rating": "float32"})`` (no compression), then ``merge_index(out)``. Opened with
``StreamingDataset(local=out, shuffle=False)``. MDS reads one sample per call: a record
by key is ``ds[i]`` through a key -> index dict, a batch ``[ds[i] for i in rows]``
stacked and padded, the epoch iterates the dataset and groups 256 samples.

A ``StreamingDataset`` registers shared memory, and file locks in the temporary
directory, that outlive its process (mosaicml/streaming#306): a leftover lock makes the
next dataset skip its prefix. Every process of this method that opens the dataset alone
calls ``streaming.base.util.clean_stale_shared_memory()`` before it opens (not timed);
readers that run at once do not (one would remove the shared memory of another): the
benchmark runs :meth:`Mds.cleanup` before them, and after the method, which does the same
and deletes the locks (the benchmark gives its processes a temporary directory of their own).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ._base import Batch, IndexedReader, Reader, RecordMethod, batches_of

COLUMNS = {"key": "str", "image": "ndarray:uint8:3,32,32", "title_ids": "ndarray:int32",
           "rating": "float32"}
SHM = "/dev/shm"
_MDS_NAME = re.compile(r"^\d{6}_")  # the prefix of its shared memory and lock names


def _write_part(task: tuple[str, list[str], Callable[[str], dict[str, Any]]]) -> int:
    from streaming import MDSWriter

    out, keys, loader = task
    with MDSWriter(out=out, columns=COLUMNS, progress_bar=False) as writer:
        for key in keys:
            rec = loader(key)
            writer.write({"key": key, "image": rec["image"], "title_ids": rec["title_ids"],
                          "rating": rec["rating"]})
    return len(keys)


def leftovers(directory: str) -> list[str]:
    """Names of MDS shared memory (``/dev/shm``) or locks (temporary directory) there."""
    try:
        return sorted(n for n in os.listdir(directory) if _MDS_NAME.match(n))
    except OSError:
        return []


class MdsReader(IndexedReader):
    """Samples in key order: parts are written in key order and merged in part order."""

    def epoch(self, batch_size: int) -> Iterator[Batch]:
        return batches_of(iter(self.ds), batch_size)


class Mds(RecordMethod):
    name = "mosaicml_streaming"
    summary = "MosaicML streaming: MDSWriter in 2 processes + merge_index, local StreamingDataset"
    modules = ("streaming",)
    packages = ("numpy", "mosaicml-streaming", "torch", "torchvision")

    def build(self, keys: list[str], out: Path, loader: Callable[[str], dict[str, Any]],
              workers: int, *, synthetic: bool = False) -> dict[str, Any]:
        from streaming.base.util import merge_index

        out.mkdir(parents=True, exist_ok=True)
        step = -(-len(keys) // workers)
        tasks = [(str(out / f"part-{k:02d}"), keys[k * step : (k + 1) * step], loader)
                 for k in range(workers)]
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            pool.map(_write_part, tasks)
        merge_index(str(out), keep_local=True)
        return {}

    def before_open(self) -> None:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()

    def open(self, out: Path, built: dict[str, Any]) -> Reader:
        from streaming import StreamingDataset

        return MdsReader(StreamingDataset(local=str(out), shuffle=False, batch_size=256))

    def cleanup(self) -> dict[str, Any]:
        from streaming.base.util import clean_stale_shared_memory

        shm = leftovers(SHM)
        clean_stale_shared_memory()
        locks = leftovers(tempfile.gettempdir())
        for name in locks:
            os.unlink(os.path.join(tempfile.gettempdir(), name))
        return {"shm_found": shm, "shm_left": leftovers(SHM), "locks_removed": locks}


METHOD = Mds()
