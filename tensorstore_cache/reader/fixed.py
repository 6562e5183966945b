"""One fixed field's array of a mapped store: its shards, mapped as they are read.

A fixed field (the ``vectors`` array of a store of one tensor per key, or a
:class:`~tensorstore_cache.format.fields.Fixed` field of a store of records)
is a sharded zarr array: shard ``k`` holds rows ``k * S`` to ``(k + 1) * S``.
Shards are mapped copy-on-write on first use, each checked first (size,
index checksum); on Linux all of them lie side by side in one reserved
address range (:class:`~tensorstore_cache.reader.vmap.VirtualRows`), so a
batch is one ``numpy.take``. A shard supply (files fetched on demand)
is asked for the shards about to be mapped, by their file ids (shard ``k``
is file ``first + k`` of the store); under its budget of mapped files (the
share of this array, :class:`~tensorstore_cache.reader.budget.MappedBudget`),
the least recently used shards are unmapped and rows are copies.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt

from ..format import FieldLayout, MappedShard, map_shard_fd, open_shard
from .budget import MappedBudget
from .mapped import MappedArray, SegmentFiles
from .sets import FEW, distinct
from .vmap import VirtualRows, virtual_rows_supported

__all__ = ["FixedArray"]


class FixedArray(MappedArray):
    """The shards of one fixed field of a store directory, mapped on demand.

    Made like every :class:`~.mapped.MappedArray`: its file ``k`` is shard ``k``.
    """

    def __init__(self, layout: FieldLayout, source: SegmentFiles, first: int = 0) -> None:
        super().__init__(layout, source, first)
        self.item_shape: tuple[int, ...] = tuple(layout.field.shape)  # type: ignore[arg-type]
        self.rows_per_shard = layout.rows_per_shard
        self.item_nbytes = layout.row_nbytes
        self._shards: list[MappedShard | None] = [None] * layout.shard_count()
        self._vrows: VirtualRows | None = None
        self._all_mapped = False
        #: Every row in one contiguous copy-on-write view, once every shard is mapped
        #: (None before, and where rows cannot be mapped contiguously).
        self.all_rows: npt.NDArray[np.generic] | None = None
        self._vmapped = [False] * len(self._shards)  # shard k sits in the contiguous view
        if self.n and virtual_rows_supported(self.rows_per_shard, self.item_nbytes):
            try:
                self._vrows = VirtualRows(self.n, self.item_shape, self.dtype, self.rows_per_shard)
            except OSError:
                self._vrows = None

    def map_all(self) -> None:
        """Map every shard now."""
        self._map_files(range(len(self._shards)))

    def shard(self, k: int) -> MappedShard:
        """Return shard ``k``, mapping (and checking) it on first use."""
        shard = self._shards[k]
        if shard is None:
            self._map_files([k])
            shard = self._shards[k]
            assert shard is not None
        return shard

    def _every_file_mapped(self) -> None:
        if self._budget is None:
            self._all_mapped = True
            if self._vrows is not None:  # every row in one contiguous view from now on
                self.all_rows = self._vrows.rows

    def _map(self, k: int) -> MappedShard:
        rel = self.layout.chunk_key(k)
        rows = min(self.rows_per_shard, self.n - k * self.rows_per_shard)
        fd, offsets = self._open(rel, lambda dir_fd: open_shard(
            f"{self.root}/{rel}",
            self.root,
            rows=rows,
            rows_per_shard=self.rows_per_shard,
            item_nbytes=self.item_nbytes,
            expected_size=self.files[rel][0],
            root_fd=dir_fd,
            trust=self.trust,
        ))
        try:
            vrows = self._vrows
            if vrows is not None and offsets is None:
                try:
                    vrows.map_shard(k, fd, rows)
                except OSError:
                    self._vrows = None
                else:
                    self._vmapped[k] = True
                    start = k * self.rows_per_shard
                    view = vrows.rows[start : start + rows]
                    return MappedShard(buffer=None, rows=view, offsets=None, dtype=self.dtype,
                                       item_shape=self.item_shape)
            if offsets is not None:  # rows not in layout order: no contiguous view
                self._vrows = None
            return map_shard_fd(
                fd, rows=rows, offsets=offsets, item_shape=self.item_shape, dtype=self.dtype
            )
        finally:
            os.close(fd)

    # -- a budget of mapped shards (see MappedBudget) -----------------------------------

    def _is_mapped(self, k: int) -> bool:
        return self._shards[k] is not None

    def _map_slot(self, k: int) -> None:
        self._shards[k] = self._map(k)

    def _unmap_slot(self, k: int) -> None:
        vrows = self._vrows
        if vrows is not None and self._vmapped[k]:
            vrows.unmap_shard(k)
            self._vmapped[k] = False
        self._shards[k] = None

    def _copy_row(self, budget: MappedBudget, row: int) -> npt.NDArray[np.generic]:
        k, i = divmod(row, self.rows_per_shard)
        with self._lock:  # the hot path: its shard is mapped
            shard = self._shards[k]
            if shard is not None:
                budget.touch(k)
                return (shard.rows[i, ...] if shard.rows is not None else shard.row(i)).copy()
        out = np.empty(self.item_shape, dtype=self.dtype)

        def read() -> None:
            shard = self._shards[k]
            assert shard is not None
            out[...] = shard.rows[i] if shard.rows is not None else shard.row(i)

        budget.with_mapped([k], read)
        return out

    def row(self, row: int) -> npt.NDArray[np.generic]:
        """Return a copy-on-write view of one row (a copy when shards are released, see budget)."""
        every = self.all_rows  # set only without a budget, once every shard is mapped
        if every is not None:
            view: npt.NDArray[np.generic] = every[row, ...]
            return view
        budget = self._budget
        if budget is not None:
            return self._copy_row(budget, row)
        vrows = self._vrows
        if vrows is not None and self._vmapped[row // self.rows_per_shard]:
            view = vrows.rows[row, ...]
            return view
        k, i = divmod(row, self.rows_per_shard)
        rows = self.shard(k).rows
        if rows is not None:
            view = rows[i, ...]
            return view
        return self.shard(k).row(i)

    def gather(self, rows: npt.NDArray[np.int64], out: npt.NDArray[np.generic]) -> None:
        """Copy ``rows`` (valid local rows) into ``out`` in order."""
        if len(rows) == 0:
            return
        vrows = self._vrows  # None if mapping found rows out of layout order
        if self._all_mapped and vrows is not None:  # the common case: one gather
            vrows.rows.take(rows, axis=0, out=out, mode="clip")  # bounds checked by the caller
            return
        if len(rows) <= FEW and self._budget is None:  # row by row (see FEW)
            few = rows.tolist()
            if not self._all_mapped:  # the batch's shards at once (a supply fetches them so)
                self._map_files(sorted({row // self.rows_per_shard for row in few}))
            for j, row in enumerate(few):
                out[j] = self.row(row)
            return
        s = self.rows_per_shard
        shard_ids = rows // s
        budget = self._budget
        if budget is not None:
            self._gather_budget(budget, rows, shard_ids, out)
            return
        if not self._all_mapped:
            self._map_files(distinct(shard_ids))
        vrows = self._vrows  # None if mapping found rows out of layout order
        if vrows is not None:
            vrows.rows.take(rows, axis=0, out=out, mode="clip")  # bounds checked by the caller
            return
        # no contiguous view (rows out of layout order, or not Linux): shard by shard
        for k in distinct(shard_ids):
            shard = self.shard(k)
            sel = np.flatnonzero(shard_ids == k)
            local = rows[sel] - k * s
            if shard.rows is not None:
                out[sel] = shard.rows[local]
            else:
                for j, i in zip(sel.tolist(), local.tolist(), strict=True):
                    out[j] = shard.row(i)

    def _gather_budget(
        self, budget: MappedBudget, rows: npt.NDArray[np.int64],
        shard_ids: npt.NDArray[np.int64], out: npt.NDArray[np.generic],
    ) -> None:
        """Gather under a budget of mapped shards: in groups, shards already mapped first."""
        ks = distinct(shard_ids)
        ks.sort(key=lambda k: self._shards[k] is None)  # stable: mapped ones first
        whole = len(ks) <= budget.limit
        for group in budget.groups(ks):
            sel = None if whole else np.flatnonzero(np.isin(shard_ids, group))

            def read(group: list[int] = group, sel: Any = sel) -> None:
                vrows = self._vrows
                if vrows is not None and all(self._vmapped[k] for k in group):
                    if sel is None:
                        vrows.rows.take(rows, axis=0, out=out, mode="clip")
                    else:
                        out[sel] = np.take(vrows.rows, rows[sel], axis=0, mode="clip")
                    return
                for k in group:
                    shard = self._shards[k]
                    assert shard is not None
                    mine = np.flatnonzero(shard_ids == k)
                    local = rows[mine] - k * self.rows_per_shard
                    if shard.rows is not None:
                        out[mine] = shard.rows[local]
                    else:
                        for j, i in zip(mine.tolist(), local.tolist(), strict=True):
                            out[j] = shard.row(i)

            budget.with_mapped(group, read)

    def file_ids(self, rows: npt.NDArray[np.int64] | None) -> list[int]:
        """The supply's ids of the shards of ``rows`` (valid local rows; None: every shard)."""
        if rows is None:
            ks = list(range(len(self._shards)))
        else:
            ks = distinct(rows // self.rows_per_shard)
        return [self._first + k for k in ks]

    def close(self) -> None:
        """Drop every mapping (views already handed out stay valid); the segment closes the
        supply."""
        self._shards = [None] * len(self._shards)
        self._vrows = None
        self.all_rows = None
        self._all_mapped = False
        if self._budget is not None:
            self._budget.clear()
