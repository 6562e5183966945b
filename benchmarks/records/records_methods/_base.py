"""What every method of the records benchmark implements, and the helpers they share.

A method builds a store of records (``key``, ``image`` (3, 32, 32) uint8, ``title_ids``
int32 of 3 to 60 tokens, ``rating`` float32) with its own writing API and 2 workers,
then opens it in other processes with its own reading API. Rows given to
:meth:`Reader.batch` are positions in the list of keys the store was built from; every
method maps them to its own storage order once, in :meth:`Reader.key_map`.

A batch is what a training step takes: ``image`` (B, 3, 32, 32) uint8, ``title_ids``
(B, Lmax) int32 padded with 0 to the longest title of the batch, ``rating`` (B,) float32.
This module imports numpy only: it runs in every environment.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WORKERS = 2
FIELDS = ("image", "title_ids", "rating")


@dataclass(frozen=True, slots=True)
class Batch:
    """Records of a batch, the ragged field padded."""

    image: np.ndarray
    title_ids: np.ndarray
    rating: np.ndarray


def pad_rows(rows: Sequence[np.ndarray], value: int = 0) -> np.ndarray:
    """``(B, Lmax)`` int32 of 1-d arrays, padded with ``value``: one concatenation and
    one masked assignment (no Python loop over the elements)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max()) if len(rows) else 0
    out = np.full((len(rows), width), value, dtype=np.int32)
    if width:
        out[np.arange(width) < lengths[:, None]] = np.concatenate(rows)
    return out


def stack_records(records: Sequence[Mapping[str, Any]]) -> Batch:
    """A :class:`Batch` of records fetched one by one (the peers without a batch read)."""
    return Batch(np.stack([r["image"] for r in records]),
                 pad_rows([np.asarray(r["title_ids"]) for r in records]),
                 np.array([r["rating"] for r in records], dtype=np.float32))


def batches_of(items: Iterator[Mapping[str, Any]], size: int) -> Iterator[Batch]:
    """Group records that an iterator yields one by one into batches of ``size``."""
    chunk: list[Mapping[str, Any]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield stack_records(chunk)
            chunk = []
    if chunk:
        yield stack_records(chunk)


class Reader(ABC):
    """A process's handle on an opened store."""

    #: how many records the store holds
    n: int = 0

    @abstractmethod
    def first(self) -> Any:
        """Read the first stored record (part of the open time: some open lazily)."""

    @abstractmethod
    def key_map(self, keys: list[str]) -> None:
        """Prepare lookups by key and the mapping of ``rows`` (positions in ``keys``)."""

    @abstractmethod
    def record(self, key: str) -> Mapping[str, Any]:
        """One record by key, as a user fetches it: its fields by name."""

    @abstractmethod
    def batch(self, rows: np.ndarray) -> Batch:
        """The records of ``keys[rows]``, the titles padded."""

    @abstractmethod
    def epoch(self, batch_size: int) -> Iterator[Batch]:
        """Every record once, in stored order, in padded batches of ``batch_size``."""

    def close(self) -> None:
        """Release files and memory."""
        return None


class IndexedReader(Reader):
    """A reader of a dataset that reads one record per call, ``ds[i]``, by position.

    By default the dataset holds the records in the order of the key list the store was
    built from: a record by key is ``ds[i]`` through a key -> index dict, a batch
    ``[ds[i] for i in rows]`` stacked and padded. A method whose dataset keeps another
    order overrides :meth:`key_map`, one that reads otherwise :meth:`record` and
    :meth:`batch`; each gives its :meth:`epoch`.
    """

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self.n = len(ds)
        self.rows = np.arange(self.n)
        self.index: dict[str, int] = {}

    def first(self) -> Any:
        return self.ds[0]

    def key_map(self, keys: list[str]) -> None:
        # the benchmark checks every record's fields against the numpy limit's
        self.index = {k: i for i, k in enumerate(keys)}
        self.rows = np.arange(len(keys))

    def record(self, key: str) -> Mapping[str, Any]:
        return self.ds[self.index[key]]  # type: ignore[no-any-return]

    def batch(self, rows: np.ndarray) -> Batch:
        ds = self.ds
        return stack_records([ds[i] for i in self.rows[rows].tolist()])


class RecordMethod(ABC):
    """One way of storing records once and reading them in many processes."""

    name: str = ""
    #: one line for the results table
    summary: str = ""
    #: libraries imported before anything is timed
    modules: tuple[str, ...] = ()
    #: distributions whose versions the results record
    packages: tuple[str, ...] = ("numpy",)

    @abstractmethod
    def build(self, keys: list[str], out: Path, loader: Callable[[str], dict[str, Any]],
              workers: int, *, synthetic: bool = False) -> dict[str, Any]:
        """Write the store of ``loader(key)`` for every key under ``out`` with ``workers``
        processes; return what :meth:`open` needs (JSON-able). ``synthetic`` stores are
        the open-time-versus-N ones, whose keys are not files."""

    def before_open(self) -> None:
        """Housekeeping before an open, not timed (clean what earlier processes left)."""
        return None

    @abstractmethod
    def open(self, out: Path, built: dict[str, Any]) -> Reader:
        """Open the store that :meth:`build` wrote (in another process)."""

    def cleanup(self) -> dict[str, Any]:
        """Release what the method leaves behind outside its directory (shared memory)."""
        return {}
