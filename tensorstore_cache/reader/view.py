"""The store as the library's own layers see it: :class:`StoreView`, reached by
:func:`~tensorstore_cache.reader.store.view_of`.

A :class:`~tensorstore_cache.CacheStore` is the user's handle; what the cache,
the command line and PyTorch need beyond it (the segments, where a row lies,
one row's value, what was recorded about the sources, the raw arrays of a
ragged field) is here, over the same mapped segments.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from ..format import FieldLayout, Fixed, Ragged
from .overlay import Overlay
from .segment import Segment
from .sources import SourceIdentity

__all__ = ["StoreView"]


@dataclasses.dataclass(eq=False)
class StoreView:
    """The segments of an open store read as one: one field of them, or whole records.

    Parameters
    ----------
    overlay
        The store's segments, later ones overriding earlier ones.
    layouts
        The fields of a store of records, by name (``{"vectors": ...}`` for one
        tensor per key).
    records
        Whether the store holds records.
    field
        The field read (None: whole records).
    location
        Where the store lives, for messages.
    """

    overlay: Overlay
    layouts: dict[str, FieldLayout]
    _: dataclasses.KW_ONLY
    records: bool
    field: str | None
    location: str
    closed: bool = dataclasses.field(default=False, init=False)
    """Whether the store was closed (set by its handle)."""
    kind: str = dataclasses.field(init=False)
    """What a row of the view is: ``"record"``, or the field's kind."""
    item_shape: tuple[int, ...] | None = dataclasses.field(init=False)
    """The shape of a fixed field's rows (None otherwise)."""
    dtype: np.dtype[Any] | None = dataclasses.field(init=False)
    """The field's element type (None: whole records)."""

    def __post_init__(self) -> None:
        layout = None if self.field is None else self.layouts[self.field]
        self.kind = "record" if layout is None else layout.kind
        shape = None if layout is None else layout.field.shape
        self.item_shape = (
            tuple(shape) if layout is not None and layout.kind == "fixed" else None  # type: ignore[arg-type]
        )
        self.dtype = None if layout is None else np.dtype(layout.dtype)

    def of_field(self, name: str) -> StoreView:
        """A view of field ``name`` of the same segments (constructed, sharing the mappings).

        Parameters
        ----------
        name
            A field of the store's schema.
        """
        return StoreView(self.overlay, self.layouts, records=self.records, field=name,
                         location=self.location)

    def check_open(self) -> None:
        """Raise ``ValueError`` if the store was closed."""
        if self.closed:
            raise ValueError(f"store {self.location!r} is closed")

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The mapped store directories, oldest first (later ones override earlier ones)."""
        return self.overlay.segments

    def __len__(self) -> int:
        return self.overlay.n

    def locate(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
        """Map valid rows to ``(segment index, local row in that segment)`` arrays.

        Parameters
        ----------
        rows
            Valid store rows.
        """
        return self.overlay.locate(rows)

    def vector(self, row: int) -> Any:
        """Return the value of ``row`` (a copy-on-write view of the mapped file, or a Record).

        Parameters
        ----------
        row
            A store row.
        """
        if self.closed:
            self.check_open()
        if not 0 <= row < self.overlay.n:
            raise IndexError(f"row {row} is out of range for a store of {self.overlay.n} rows")
        return self.value(*self.overlay.locate_one(row))

    def value(self, k: int, local: int) -> Any:
        """The value of local row ``local`` of segment ``k``.

        Parameters
        ----------
        k
            A segment's index.
        local
            A row of that segment.
        """
        segment = self.overlay.segments[k]
        if self.field is None:
            return segment.record(local)
        return segment.arrays[self.field].row(local)

    def source_identity(
        self, rows: npt.NDArray[np.int64], *, content_hash: bool = False
    ) -> SourceIdentity:
        """Return what was recorded about the sources of valid ``rows`` at build time.

        Parameters
        ----------
        rows
            Store rows.
        content_hash
            Also return the recorded content hashes (0 where none was recorded).
        """
        self.check_open()
        size = np.empty(len(rows), np.int64)
        mtime = np.empty(len(rows), np.int64)
        hashes = np.zeros(len(rows), np.uint64) if content_hash else None
        kinds = np.full(len(rows), "stat", dtype="<U5")
        for k, sel, local in self.overlay.by_segment(rows):
            seg = self.segments[k]
            size[sel] = seg.source_size[local]
            mtime[sel] = seg.source_mtime_ns[local]
            kinds[sel] = seg.spec.identity
            recorded = seg.content_hashes() if hashes is not None else None
            if hashes is not None and recorded is not None:
                hashes[sel] = recorded[local]
        return SourceIdentity(size=size, mtime_ns=mtime, content_hash=hashes, recorded=kinds)

    def gather_values(
        self, name: str, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        """``(values, offsets from 0, shapes or None)`` of ragged or text field ``name`` of
        valid ``rows``: the raw arrays (text as its UTF-8 bytes), one gather.

        Parameters
        ----------
        name
            A ragged or text field.
        rows
            Valid store rows.
        """
        self.check_open()
        layout = self.layouts[name]
        if isinstance(layout.field, Fixed):
            raise TypeError(f"field {name!r} is fixed; gather it with take()")
        if len(rows) == 0:
            f = layout.field
            shapes = (np.empty((0, len(f.varying)), np.int64)
                      if isinstance(f, Ragged) and f.flat else None)
            return np.empty((0, *f.inner), np.dtype(f.dtype)), np.zeros(1, np.int64), shapes
        return self.overlay.gather_ragged(rows, name)

    def value_lengths(
        self, name: str, rows: npt.NDArray[np.int64], *, first_dim: bool = False
    ) -> npt.NDArray[np.int64]:
        """How many rows of ``values`` each of valid ``rows`` has in ragged or text field
        ``name`` (from the offsets alone), or with ``first_dim`` its size along the first
        varying dimension (from the shapes, where several vary).

        Parameters
        ----------
        name
            The field (ragged or text).
        rows
            The store rows asked (valid, in any order).
        first_dim
            Each row's size along the field's first varying dimension instead.
        """
        self.check_open()
        out = np.empty(len(rows), np.int64)
        for k, sel, local in self.overlay.by_segment(np.asarray(rows, np.int64)):
            array = self.overlay.segments[k].ragged(name)
            start, stop = array.spans(local)
            shapes = array.shapes if first_dim else None
            out[sel] = stop - start if shapes is None else shapes[local, 0]
        return out
