"""One ragged (or text) field of a mapped store: values, offsets and shapes.

A ragged field's ``values`` chunk files are mapped copy-on-write side by side
in one reserved address range (:class:`~tensorstore_cache.reader.vmap.VirtualRows`,
Linux), so a row that straddles two chunks is still one view; elsewhere, each
chunk is mapped apart and such a row is copied. ``offsets`` (and ``shapes``)
are mapped read-only, at open.

A local store maps every chunk at the first read of the field. A store whose
files are fetched on demand (a :class:`~tensorstore_cache.reader.supply.ShardSupply`)
maps a chunk when a row in it is first read, after asking the supply for it
(chunk ``k`` is file ``first + k`` of the store; all the chunks of one read at
once). Under the supply's budget of mapped files, at most this array's share
of chunks stay mapped (least recently used ones are unmapped and given back:
:class:`~tensorstore_cache.reader.budget.MappedBudget`), each mapped apart:
rows and batches are then **copies**, never views that could point into a
released chunk.

Offsets come from a file that could be hostile: a row's offsets are checked
(``0 <= offsets[i] <= offsets[i+1] <= total``, vectorised for a batch) before
any view is made, so a bad offset raises
:class:`~tensorstore_cache.errors.CorruptStoreError` and never reaches the
reserved pages around the mapping (which would kill the process). A flat
row's shape must hold exactly its values. :meth:`RaggedArray.check` checks
every row (``verify``).
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError
from ..format import FieldLayout, Ragged
from ..fs import StoreWalk, map_file, open_sized
from .mapped import MappedArray, SegmentFiles
from .sets import FEW, int_bounds, int_items
from .vmap import VirtualRows, virtual_rows_supported

__all__ = ["RaggedArray"]


class RaggedArray(MappedArray):
    """The arrays of one ragged or text field of a store directory.

    Made like every :class:`~.mapped.MappedArray`: its file ``k`` is chunk ``k``; ``walk``
    opens the offsets and shapes, mapped here (see
    :class:`~tensorstore_cache.fs.opens.StoreWalk`; None: from the segment's directory).
    """

    def __init__(self, layout: FieldLayout, source: SegmentFiles, first: int = 0,
                 walk: StoreWalk | None = None) -> None:
        super().__init__(layout, source, first)
        self.total = layout.total
        self.field = layout.field
        self.flat = isinstance(layout.field, Ragged) and layout.field.flat
        self.inner = layout.field.inner
        self._text = layout.kind == "text"
        self._buffers: list[mmap.mmap] = []
        self.offsets: npt.NDArray[np.uint64] = self._index(
            "offsets", self.n + 1, "<u8", (self.n + 1,), walk)
        k = len(layout.field.varying) if isinstance(layout.field, Ragged) else 1
        self.shapes: npt.NDArray[np.int32] | None = (
            self._index("shapes", self.n, "<i4", (self.n, k), walk) if self.flat else None
        )
        self._starts = int_items(self.offsets, "Q")  # a row's offsets as ints: no NumPy call
        #: a row is its slice of the values as it is: 1-d numbers, every chunk kept mapped
        self._plain = self.shapes is None and not self.inner and not self._text and (
            self._budget is None)
        if self.n and int(self.offsets[-1]) != self.total:
            raise self._bad("offsets", f"its last offset is {int(self.offsets[-1])}, not the "
                            f"{self.total} values the store records")
        self._chunks: list[npt.NDArray[Any] | None] = [None] * self._count  # mapped chunks
        self._in_vrows = [False] * self._count  # chunk k lies in its slot of the contiguous view
        self._values: npt.NDArray[Any] | None = None  # every row of values, once all are mapped
        self._all_mapped = self._count == 0
        self._vrows: VirtualRows | None = None  # where chunks are mapped (None: apart)
        self._vview: npt.NDArray[Any] | None = None  # its rows (kept if mapping into it fails)
        if (self.total and self._budget is None
                and virtual_rows_supported(layout.chunk, layout.row_nbytes)):
            try:
                self._vrows = VirtualRows(self.total, self.inner, self.dtype, layout.chunk)
            except OSError:
                self._vrows = None
            else:
                self._vview = self._vrows.rows

    # -- opening ------------------------------------------------------------------------

    def _bad(self, array: str, detail: str) -> CorruptStoreError:
        path = self.root / self.layout.path / array
        return CorruptStoreError(
            f"{path}: {detail}; the store's field {self.layout.name!r} is damaged (run verify, "
            "then rebuild it)", str(path),
        )

    def _index(
        self, array: str, length: int, dtype: str, shape: tuple[int, ...], walk: StoreWalk | None
    ) -> Any:
        if length == 0:
            return np.zeros(shape, dtype)
        rel = f"{self.layout.path}/{array}/c/0" + ("/0" if len(shape) == 2 else "")
        path = f"{self.root}/{rel}"
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        buf = map_file(path, self.root, self.files[rel][0],
                       root_fd=self.source.dir_fd() if walk is None else walk, trust=self.trust)
        if buf is None or len(buf) != nbytes:
            raise CorruptStoreError(f"{path} has the wrong size", path)
        self._buffers.append(buf)
        return np.frombuffer(buf, dtype, math.prod(shape)).reshape(shape)

    # -- mapping chunks -----------------------------------------------------------------

    def _map_chunk(self, k: int) -> npt.NDArray[Any]:
        """Map chunk ``k`` (checked first) and return its rows of values (under the lock)."""
        layout = self.layout
        rel = layout.chunk_key(k)
        path = f"{self.root}/{rel}"
        rows = min(layout.chunk, self.total - k * layout.chunk)
        size = self.files[rel][0]
        if size != layout.chunk * layout.row_nbytes:
            raise CorruptStoreError(
                f"{path} has {size} bytes, not the {layout.chunk * layout.row_nbytes} "
                "of a chunk", path)
        fd = self._open(rel, lambda dir_fd: open_sized(path, self.root, size, dir_fd,
                                                       trust=self.trust))
        try:
            vrows = self._vrows
            if vrows is not None:
                try:
                    vrows.map_shard(k, fd, rows)
                except OSError:
                    self._vrows = None  # chunks mapped from now on lie apart
                else:
                    self._in_vrows[k] = True
                    start = k * layout.chunk
                    view: npt.NDArray[Any] = vrows.rows[start : start + rows]
                    return view
            buf = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        elems = rows * max(math.prod(self.inner), 1)
        return np.frombuffer(buf, self.dtype, elems).reshape((rows, *self.inner))

    def _every_file_mapped(self) -> None:
        self._all_mapped = True
        if self._vview is not None and all(self._in_vrows):
            self._values = self._vview  # every row in one contiguous view from now on

    # -- a budget of mapped chunks (see MappedBudget) -----------------------------------

    def _is_mapped(self, k: int) -> bool:
        return self._chunks[k] is not None

    def _map_slot(self, k: int) -> None:
        self._chunks[k] = self._map_chunk(k)

    def _unmap_slot(self, k: int) -> None:
        self._chunks[k] = None  # mapped apart: its mapping goes with the last copy read

    def map_all(self) -> None:
        """Map every chunk now (not under a budget: there, chunks are mapped as read)."""
        if self._budget is None:
            self._map_files(range(self._count))

    def chunks_of(self, start: npt.NDArray[np.int64], stop: npt.NDArray[np.int64]) -> list[int]:
        """The chunks holding the values ``start[i]:stop[i]`` (checked spans), ascending."""
        full = stop > start
        if not bool(np.any(full)):
            return []
        chunk = self.layout.chunk
        first = start[full] // chunk
        last = (stop[full] - 1) // chunk
        edges = (np.bincount(first, minlength=self._count + 1)
                 - np.bincount(last + 1, minlength=self._count + 1))
        touched: list[int] = np.flatnonzero(np.cumsum(edges[: self._count]) > 0).tolist()
        return touched

    def file_ids(self, rows: npt.NDArray[np.int64] | None) -> list[int]:
        """The supply's ids of the chunks of ``rows`` (valid local rows; None: every chunk)."""
        ks = list(range(self._count)) if rows is None else self.chunks_of(*self.spans(rows))
        return [self._first + k for k in ks]

    # -- rows ---------------------------------------------------------------------------

    def spans(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(start, stop)`` in ``values`` of every row of ``rows`` (valid local rows), checked."""
        first, last = self.offsets[rows], self.offsets[1:][rows]
        # unsigned: with both ends within the values, an offset that decreases makes a
        # length past any total
        if len(rows) and (int_bounds(last)[1] > self.total or int_bounds(first)[1] > self.total
                          or int_bounds(last - first)[1] > self.total):
            raise self._bad("offsets", "an offset decreases or passes the values")
        start: npt.NDArray[np.int64] = first.view("<i8")  # within the values: no sign to lose
        stop: npt.NDArray[np.int64] = last.view("<i8")
        if self.shapes is not None and not self._shapes_hold(rows, start, stop):
            raise self._bad("shapes", "a row's shape does not hold its values")
        return start, stop

    def _shapes_hold(self, rows: npt.NDArray[np.int64], start: npt.NDArray[np.int64],
                     stop: npt.NDArray[np.int64]) -> bool:
        """Whether each row's stored shape holds its span of values (a few rows in Python:
        see :data:`~.sets.FEW`)."""
        assert self.shapes is not None
        sizes = self.shapes[rows].astype(np.int64)
        fixed = self._fixed_elems()
        if len(rows) <= FEW:
            return all(min(size) >= 0 and fixed * math.prod(size) == b - a for size, a, b
                       in zip(sizes.tolist(), start.tolist(), stop.tolist(), strict=True))
        # a product past 2**62 holds no span (and would wrap in int64 to one that may match)
        wide = fixed * np.prod(sizes.astype(np.float64), axis=1)
        return not (bool(np.any(sizes < 0)) or bool(np.any(wide >= 2.0**62))
                    or bool(np.any(fixed * np.prod(sizes, axis=1) != stop - start)))

    def _fixed_elems(self) -> int:
        return math.prod(d for d in self.field.shape if d is not None)

    def row_shape(self, row: int, length: int) -> tuple[int, ...]:
        """The shape of ``row`` (``length``: its size along the first axis of values)."""
        if self.shapes is None:
            return (length, *self.inner)
        sizes = iter(self.shapes[row].tolist())
        return tuple(next(sizes) if d is None else d for d in self.field.shape)

    def _prepare(self, ks: Sequence[int]) -> None:
        """Map what a read of chunks ``ks`` needs (a local store: every chunk, once)."""
        if not self._all_mapped:
            self._map_files(range(self._count) if self._supply is None else ks)

    def _contiguous(self, ks: Sequence[int]) -> npt.NDArray[Any] | None:
        """The contiguous view of values if every chunk of ``ks`` lies in it (else None)."""
        if self._values is not None:
            return self._values
        view = self._vview
        if view is not None and all(self._in_vrows[k] for k in ks):
            return view
        return None

    def _copy_pieces(
        self, ks: Sequence[int], start: npt.NDArray[np.int64], stop: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64], out: npt.NDArray[Any],
    ) -> None:
        """Copy the parts of spans ``start:stop`` that lie in mapped chunks ``ks`` into ``out``
        (row ``i`` at ``offsets[i]``), chunk by chunk: no loop over rows."""
        chunk = self.layout.chunk
        for k in ks:
            rows = self._chunks[k]
            assert rows is not None
            lo = k * chunk
            a = np.maximum(start, lo)
            b = np.minimum(stop, lo + len(rows))
            sel = np.flatnonzero(b > a)
            if not len(sel):
                continue
            a, b = a[sel], b[sel]
            n = b - a
            within = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
            out[np.repeat(offsets[sel] + (a - start[sel]), n) + within] = rows[
                np.repeat(a - lo, n) + within]

    def _gather_spans(
        self, start: npt.NDArray[np.int64], stop: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
        """The values of the checked spans ``start:stop``, concatenated (a copy), and offsets."""
        lengths = stop - start
        offsets = np.zeros(len(start) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if self._budget is None and self._supply is None:
            self._prepare(())  # a local store: every chunk, mapped once (no chunk list needed)
        if self._values is not None and self._budget is None:  # every chunk mapped: one gather
            index = np.repeat(start - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
            return np.take(self._values, index, axis=0), offsets
        ks = self.chunks_of(start, stop)
        budget = self._budget
        if budget is not None:
            out = np.empty((total, *self.inner), self.dtype)
            for group in budget.groups(ks):

                def read(group: list[int] = group) -> None:
                    self._copy_pieces(group, start, stop, offsets, out)

                budget.with_mapped(group, read)
            return out, offsets
        self._prepare(ks)
        whole = self._contiguous(ks)
        if whole is not None:  # one gather (only mapped chunks are touched)
            index = np.repeat(start - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
            return np.take(whole, index, axis=0), offsets
        out = np.empty((total, *self.inner), self.dtype)
        self._copy_pieces(ks, start, stop, offsets, out)
        return out, offsets

    def values(self, start: int, stop: int) -> npt.NDArray[Any]:
        """``values[start:stop]``: a view of the mapped chunks (a copy if it straddles two
        chunks that lie apart, and always under a budget)."""
        if self._values is not None and self._budget is None:  # every chunk mapped: a slice
            return self._values[start:stop]
        if stop <= start:
            return np.empty((0, *self.inner), self.dtype)
        if self._budget is not None:
            return self._gather_spans(np.array([start], np.int64), np.array([stop], np.int64))[0]
        chunk = self.layout.chunk
        first, last = start // chunk, (stop - 1) // chunk
        ks = list(range(first, last + 1))
        self._prepare(ks)
        whole = self._contiguous(ks)
        if whole is not None:
            return whole[start:stop]
        if first == last:
            rows = self._chunks[first]
            assert rows is not None
            return rows[start - first * chunk : stop - first * chunk]
        return self._gather_spans(np.array([start], np.int64), np.array([stop], np.int64))[0]

    def row(self, row: int) -> Any:
        """Row ``row``: a copy-on-write view of its values (``str`` for text; a copy under a
        budget)."""
        starts = self._starts
        start, stop = starts[row], starts[row + 1]
        if not 0 <= start <= stop <= self.total:
            raise self._bad("offsets", "an offset decreases or passes the values")
        every = self._values
        if every is not None and self._plain:  # the common case: a view of its slice
            return every[start:stop]
        if self.shapes is not None:
            sizes = self.shapes[row].tolist()
            if min(sizes) < 0 or self._fixed_elems() * math.prod(sizes) != stop - start:
                raise self._bad("shapes", "a row's shape does not hold its values")
        # values(), inlined
        view = every[start:stop] if every is not None and self._budget is None else self.values(
            start, stop)
        if self._text:
            return view.tobytes().decode("utf-8", "surrogateescape")
        if self.shapes is None and not self.inner:  # a 1-d row: the slice is its shape
            return view
        return view.reshape(self.row_shape(row, stop - start))

    def gather(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        """``(values, offsets from 0, shapes or None)`` of ``rows``: one gather (a copy)."""
        if len(rows) <= FEW and self.shapes is None and self._budget is None:
            return (*self._gather_few(rows.tolist()), None)
        start, stop = self.spans(rows)
        values, offsets = self._gather_spans(start, stop)
        shapes = None if self.shapes is None else self.shapes[rows].astype(np.int64)
        return values, offsets, shapes

    def _gather_few(self, rows: list[int]) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
        """:meth:`gather` of a few rows of a field without shapes, row by row (see
        :data:`~.sets.FEW`): their offsets checked as :meth:`spans` does."""
        starts, spans = self._starts, []
        for row in rows:
            start, stop = starts[row], starts[row + 1]
            if not start <= stop <= self.total:
                raise self._bad("offsets", "an offset decreases or passes the values")
            spans.append((start, stop))
        chunk = self.layout.chunk  # the batch's chunks at once (a supply fetches them so)
        self._prepare(sorted({k for start, stop in spans if stop > start
                              for k in range(start // chunk, (stop - 1) // chunk + 1)}))
        offsets = list(itertools.accumulate((stop - start for start, stop in spans), initial=0))
        out = np.empty((offsets[-1], *self.inner), self.dtype)
        for (start, stop), at in zip(spans, offsets, strict=False):
            out[at : at + stop - start] = self.values(start, stop)
        return out, np.array(offsets, np.int64)

    def check(self) -> None:
        """Check every row's offsets (and shapes): what ``verify`` asks of a ragged field."""
        if self.n:
            if int(self.offsets[0]) != 0:
                raise self._bad("offsets", "the first offset is not 0")
            self.spans(np.arange(self.n, dtype=np.int64))

    def close(self) -> None:
        """Drop the mappings (views already handed out stay valid); the segment closes the
        supply."""
        self._values = None
        self._vview = None
        self._vrows = None
        self._chunks = [None] * self._count
        self._in_vrows = [False] * self._count
        self._all_mapped = False
        if self._budget is not None:
            self._budget.clear()
        self._buffers = []
