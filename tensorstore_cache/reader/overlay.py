"""Live rows of a store made of segments, later ones overriding earlier ones; key lookups.

A cache namespace is a list of immutable parts; when a later part holds a key
an earlier part also holds (the source changed and was recomputed), the later
entry wins and the earlier row is *dead*. :class:`Overlay` numbers the live
rows ``0 .. n-1``, segment after segment, each in its own row order, and maps
between those numbers and ``(segment, local row)``. A store of one segment is
the trivial overlay: every row is live and store rows are its local rows.

Computing the dead rows costs one vectorised ``searchsorted`` of every
segment's sorted key hashes in every later segment's, plus a byte comparison
of the (few) hash matches: ``O(N log N)`` numpy work, done once, lazily (never
for one segment).

The key lookups of a store live here, once: :meth:`Overlay.find` for one key
and :meth:`Overlay.find_many` for many, newest segment first.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..format import KeyLayout, encode_key, hash_encoded, hash_key, key_layout
from .segment import Segment
from .sets import distinct

__all__ = ["Overlay", "overridden_rows"]


def overridden_rows(seg: Segment, later: Segment) -> npt.NDArray[np.int64]:
    """Return the local rows of ``seg`` whose key ``later`` also holds."""
    if seg.n == 0 or later.n == 0:
        return np.empty(0, np.int64)
    mine, theirs = seg.keys, later.keys
    pos = np.minimum(np.searchsorted(theirs.key_hash, mine.key_hash), later.n - 1)
    cand = np.flatnonzero(theirs.key_hash[pos] == mine.key_hash)
    if len(cand) == 0:
        return np.empty(0, np.int64)
    rows = mine.key_row[cand].astype(np.int64)
    encoded = [mine.key_at(r) for r in rows.tolist()]
    found = theirs.find_many(encoded, mine.key_hash[cand].astype(np.uint64, copy=False))
    return rows[found >= 0]


class Overlay:
    """Numbering of the live rows of ``segments`` (later segments win), and key lookups.

    Parameters
    ----------
    segments
        Oldest first.
    """

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = tuple(segments)
        self._done = False
        self._live: list[npt.NDArray[np.int64] | None] = [None] * len(self.segments)
        self._rank: list[npt.NDArray[np.int64] | None] = [None] * len(self.segments)
        self._starts: list[int] = list(itertools.accumulate((seg.n for seg in self.segments),
                                                            initial=0))
        self._offsets = np.array(self._starts, dtype=np.int64)
        if len(self.segments) <= 1:
            self._done = True  # one segment: nothing overrides anything

    def _compute(self) -> None:
        if self._done:
            return
        live: list[npt.NDArray[np.int64] | None] = []
        rank: list[npt.NDArray[np.int64] | None] = []
        counts = []
        for k, seg in enumerate(self.segments):
            dead: npt.NDArray[np.bool_] | None = None
            for later in self.segments[k + 1 :]:
                hit = overridden_rows(seg, later)
                if len(hit):
                    if dead is None:
                        dead = np.zeros(seg.n, bool)
                    dead[hit] = True
            if dead is None:
                live.append(None)
                rank.append(None)
                counts.append(seg.n)
            else:
                alive = ~dead
                live.append(np.flatnonzero(alive).astype(np.int64))
                rank.append(np.cumsum(alive, dtype=np.int64) - 1)
                counts.append(int(alive.sum()))
        self._live, self._rank = live, rank
        self._offsets = np.cumsum([0, *counts], dtype=np.int64)
        self._starts = self._offsets.tolist()
        self._done = True

    # -- numbering ------------------------------------------------------------

    @property
    def n(self) -> int:
        """Number of live rows (distinct keys)."""
        self._compute()
        return self._starts[-1]

    @property
    def total_rows(self) -> int:
        """Rows stored in all segments, dead ones included."""
        return sum(seg.n for seg in self.segments)

    @property
    def dead_rows(self) -> int:
        """Rows overridden by a later segment."""
        return self.total_rows - self.n

    def live_rows(self, k: int) -> npt.NDArray[np.int64]:
        """Return the live local rows of segment ``k``, ascending."""
        self._compute()
        live = self._live[k]
        return np.arange(self.segments[k].n, dtype=np.int64) if live is None else live

    def to_global(self, k: int, local: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Map live local rows of segment ``k`` to store rows."""
        self._compute()
        rank = self._rank[k]
        mapped = local if rank is None else rank[local]
        return mapped + self._starts[k] if self._starts[k] else mapped

    def one_to_global(self, k: int, local: int) -> int:
        """Map one live local row of segment ``k`` to its store row."""
        self._compute()
        rank = self._rank[k]
        return self._starts[k] + (local if rank is None else int(rank[local]))

    def locate(
        self, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
        """Map valid store rows to ``(segment index, local row)`` arrays."""
        self._compute()
        if len(self.segments) == 1:
            return np.zeros(len(rows), np.intp), rows
        seg_of = np.searchsorted(self._offsets, rows, side="right") - 1
        local = rows - self._offsets[seg_of]
        for k in distinct(seg_of):
            live = self._live[k]
            if live is not None:
                sel = seg_of == k
                local[sel] = live[local[sel]]
        return seg_of, local

    def by_segment(
        self, rows: npt.NDArray[np.int64]
    ) -> Iterator[tuple[int, npt.NDArray[np.intp], npt.NDArray[np.int64]]]:
        """Valid store ``rows`` by segment: ``(segment index, their places in rows, their
        local rows)`` for each segment holding some, in segment order."""
        seg_of, local = self.locate(rows)
        for k in distinct(seg_of):
            sel = np.flatnonzero(seg_of == k)
            yield k, sel, local[sel]

    def locate_one(self, row: int) -> tuple[int, int]:
        """Map one valid store row to ``(segment index, local row)``."""
        self._compute()
        k = bisect.bisect_right(self._starts, row) - 1
        local = row - self._starts[k]
        live = self._live[k]
        return k, local if live is None else int(live[local])

    def paths(self) -> list[str]:
        """Every live key, in store row order."""
        self._compute()
        out: list[str] = []
        for k, seg in enumerate(self.segments):
            keys = seg.keys.key_list()
            live = self._live[k]
            out.extend(keys if live is None else [keys[i] for i in live.tolist()])
        return out

    # -- lookups ----------------------------------------------------------------

    def find(self, key: str) -> tuple[int, int]:
        """Return ``(segment index, local row)`` of a normalised key, ``(-1, -1)`` if absent."""
        encoded = encode_key(key)
        h = hash_key(encoded)
        segments = self.segments
        for k in range(len(segments) - 1, -1, -1):  # the newest segment wins
            row = segments[k].keys.find(encoded, h)
            if row >= 0:
                return k, row
        return -1, -1

    def find_many(
        self, encoded: Sequence[bytes], layout: KeyLayout | None = None
    ) -> npt.NDArray[np.int64]:
        """Return the store row of every encoded key, -1 where absent.

        Segments are searched biggest first: a key found in a live row is found
        for good (no later segment holds it), one found in a dead row is looked
        for in the other segments, one of which holds it live. Most keys of a
        cache namespace (one big part, a few small ones) take one search.
        ``layout`` holds the same keys joined (made here when not given).
        """
        hashes = hash_encoded(encoded)
        segments = self.segments
        if layout is None:
            layout = key_layout(encoded)
        if len(segments) == 1:
            return segments[0].keys.find_many(encoded, hashes, layout)
        self._compute()
        out = np.full(len(encoded), -1, dtype=np.int64)
        todo: npt.NDArray[np.intp] | None = None  # None: every key
        for k in sorted(range(len(segments)), key=lambda k: (-segments[k].n, -k)):
            if todo is None:
                found = segments[k].keys.find_many(encoded, hashes, layout)
            else:
                found = segments[k].keys.find_many([encoded[i] for i in todo.tolist()],
                                                   hashes[todo], layout.take(todo))
            hit = found >= 0
            live, rank = self._live[k], self._rank[k]
            if live is not None and rank is not None and hit.any():
                where = np.flatnonzero(hit)
                local = found[where]
                at = rank[local]
                if len(live):  # else every row of segment k is dead
                    hit[where] = (at >= 0) & (live[np.maximum(at, 0)] == local)
                else:
                    hit[where] = False
            place = np.flatnonzero(hit) if todo is None else todo[hit]
            out[place] = self.to_global(k, found[hit])
            todo = np.flatnonzero(~hit) if todo is None else todo[~hit]
            if len(todo) == 0:
                break
        return out

    def gather(
        self, rows: npt.NDArray[np.int64], out: npt.NDArray[np.generic], field: str = "vectors"
    ) -> None:
        """Copy the values of fixed ``field`` of valid store ``rows`` into ``out`` in order."""
        if len(self.segments) == 1:
            self.segments[0].fixed(field).gather(rows, out)
            return
        for k, sel, local in self.by_segment(rows):
            part = np.empty((len(sel), *out.shape[1:]), dtype=out.dtype)
            self.segments[k].fixed(field).gather(local, part)
            out[sel] = part

    def gather_ragged(
        self, rows: npt.NDArray[np.int64], field: str
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
        """``(values, offsets from 0, shapes or None)`` of ragged ``field`` of valid ``rows``."""
        if len(self.segments) == 1:
            return self.segments[0].ragged(field).gather(rows)
        parts = {k: (sel, self.segments[k].ragged(field).gather(local))
                 for k, sel, local in self.by_segment(rows)}
        lengths = np.empty(len(rows), np.int64)
        for sel, (_values, offsets, _shapes) in parts.values():
            lengths[sel] = np.diff(offsets)
        out_offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=out_offsets[1:])
        first = next(iter(parts.values()))[1]
        values = np.empty((int(out_offsets[-1]), *first[0].shape[1:]), first[0].dtype)
        shapes = None if first[2] is None else np.empty((len(rows), first[2].shape[1]), np.int64)
        for sel, (part_values, part_offsets, part_shapes) in parts.values():
            # the rows of this segment, in batch order: each run of values to its place
            starts = out_offsets[sel]
            index = np.repeat(starts - part_offsets[:-1], np.diff(part_offsets))
            index += np.arange(len(part_values), dtype=np.int64)
            values[index] = part_values
            if shapes is not None and part_shapes is not None:
                shapes[sel] = part_shapes
        return values, out_offsets, shapes
