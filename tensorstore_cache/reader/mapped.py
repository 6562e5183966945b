"""What the arrays of a segment share: where their files are, mapped as they are read.

A segment gives each of its arrays (:class:`~.fixed.FixedArray` for a fixed
field, :class:`~.ragged.RaggedArray` for a ragged or text one) the same
:class:`SegmentFiles`: the store directory it opened, its file list, whose
files may be read, and the supply of a store whose files are fetched on
demand, whose budget of mapped files the arrays share. :class:`MappedArray`
is what the two kinds of array have in common: their files (file ``k`` of an
array is the supply's file ``first + k``), asked of the supply before they are
mapped, under a :class:`~.budget.MappedBudget` when the supply has one.
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError
from ..format import FieldLayout
from ..fs import StoreWalk, Trust
from .budget import MappedBudget
from .supply import ShardSupply

__all__ = ["MappedArray", "SegmentFiles", "prefetched"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SegmentFiles:
    """The files of one segment, as its arrays read them."""

    root: Path
    """The store directory (named in errors)."""
    dir_fd: Callable[[], int]
    """Returns the descriptor of the store directory the segment opened (raises once the
    segment is closed)."""
    files: dict[str, tuple[int, str]]
    """The store's file list (sizes checked before mapping)."""
    trust: Trust
    """Checked on every file opened."""
    supply: ShardSupply | None = None
    """Makes files present before they are mapped (None: all are there); owned by the
    segment, which closes it."""
    share: int = 1
    """How many arrays share the supply's budget: each keeps at most ``budget // share``
    files mapped (at least one), and returns copies."""


def prefetched(supply: ShardSupply | None, ids: Callable[[], list[int]],
               background: bool) -> Future[int]:
    """Fetch the files ``ids()`` from ``supply`` ahead of reads (a future of the number
    downloaded; done at once, 0, without a supply).

    Parameters
    ----------
    supply
        The segment's supply (None: every file is there).
    ids
        The supply's ids of the files (called only with a supply).
    background
        Return at once, fetching in the background.
    """
    if supply is None:
        done: Future[int] = Future()
        done.set_result(0)
        return done
    return supply.prefetch(ids(), background=background)


class MappedArray(abc.ABC):
    """The files of one field's array of a segment, mapped as they are read.

    Parameters
    ----------
    layout
        The field.
    source
        The segment's files.
    first
        The supply's id of the array's file 0 (file ``k`` is ``first + k``).
    """

    def __init__(self, layout: FieldLayout, source: SegmentFiles, first: int = 0) -> None:
        self.layout = layout
        self.source = source
        self.root, self.files, self.trust = source.root, source.files, source.trust
        self.n = layout.n
        self.dtype: np.dtype[Any] = np.dtype(layout.dtype).newbyteorder("<")
        self._supply = source.supply
        self._first = first
        self._count = layout.shard_count()  # the array's files
        self._lock = threading.Lock()
        self._budget = MappedBudget.of(  # None: every file stays mapped, rows are views
            source.supply, share=source.share, first=first, lock=self._lock,
            is_mapped=self._is_mapped, map_file=self._map_slot, unmap_file=self._unmap_slot,
        )
        #: While :meth:`_map_files` maps: its walk of the store directory (each directory
        #: on the way to the files opened once for all of them)
        self._walk: StoreWalk | None = None

    def _open(self, rel: str, opener: Callable[[int | StoreWalk], T]) -> T:
        """``opener(dir_fd)``: open file ``rel`` of the store directory (``dir_fd``: its
        descriptor, or the walk of :meth:`_map_files` mapping it); the error of a file that is
        not there says so if the directory was replaced since the store was opened."""
        walk = self._walk
        dir_fd = self.source.dir_fd() if walk is None else walk.root_fd
        try:
            return opener(dir_fd if walk is None else walk)
        except CorruptStoreError as exc:
            if os.fstat(dir_fd).st_nlink == 0:  # our directory was removed
                raise CorruptStoreError(
                    f"{self.root} was replaced or deleted after this store was opened, and "
                    f"{rel} had not been read yet; open the store again", str(self.root / rel),
                ) from exc
            raise

    def _map_files(self, ks: Sequence[int]) -> None:
        """Map the files ``ks`` not mapped yet, the supply asked once for all of them (outside
        the budget: a read under one takes them in); once every file of the array is
        mapped, :meth:`_every_file_mapped` runs (under the lock)."""
        todo = [k for k in ks if not self._is_mapped(k)]
        if not todo:
            return
        if self._supply is not None:
            self._supply.ensure([self._first + k for k in todo])
        with self._lock, StoreWalk(self.root, self.source.dir_fd(), self.trust) as walk:
            self._walk = walk
            try:
                for k in todo:
                    if not self._is_mapped(k):
                        self._map_slot(k)
            finally:
                self._walk = None
            if all(self._is_mapped(k) for k in range(self._count)):
                self._every_file_mapped()

    @abc.abstractmethod
    def _every_file_mapped(self) -> None:
        """Every file of the array is mapped now (under the lock)."""

    @property
    def budget(self) -> int | None:
        """Most files mapped at once (None: no limit, rows are views)."""
        return None if self._budget is None else self._budget.limit

    def prefetch(
        self, rows: npt.NDArray[np.int64] | None, *, background: bool = False
    ) -> Future[int]:
        """Fetch the files of ``rows`` (every file if None) ahead of reads."""
        return prefetched(self._supply, lambda: self.file_ids(rows), background)

    @abc.abstractmethod
    def file_ids(self, rows: npt.NDArray[np.int64] | None) -> list[int]:
        """The supply's ids of the files of ``rows`` (valid local rows; None: every file)."""

    @abc.abstractmethod
    def map_all(self) -> None:
        """Map every file now."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop every mapping (views already handed out stay valid); the segment closes the
        supply."""

    # -- a budget of mapped files (see MappedBudget) ------------------------------------

    @abc.abstractmethod
    def _is_mapped(self, k: int) -> bool:
        """Whether file ``k`` is mapped."""

    @abc.abstractmethod
    def _map_slot(self, k: int) -> None:
        """Map file ``k`` (under the lock)."""

    @abc.abstractmethod
    def _unmap_slot(self, k: int) -> None:
        """Unmap file ``k`` (under the lock)."""
