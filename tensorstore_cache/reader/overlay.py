"""Live rows of a store made of several segments, later ones overriding earlier ones.

A cache namespace is a list of immutable parts; when a later part holds a key
an earlier part also holds (the source changed and was recomputed), the later
entry wins and the earlier row is *dead*. :class:`Overlay` numbers the live
rows ``0 .. n-1``, segment after segment, each in its own row order, and maps
between those numbers and ``(segment, local row)``.

Computing the dead rows costs one vectorised ``searchsorted`` of every
segment's sorted key hashes in every later segment's, plus a byte comparison
of the (few) hash matches: ``O(N log N)`` numpy work, done once, lazily.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .segment import Segment

__all__ = ["Overlay", "overridden_rows"]


def overridden_rows(seg: Segment, later: Segment) -> npt.NDArray[np.int64]:
    """Return the local rows of ``seg`` whose key ``later`` also holds."""
    if seg.n == 0 or later.n == 0:
        return np.empty(0, np.int64)
    pos = np.minimum(np.searchsorted(later.key_hash, seg.key_hash), later.n - 1)
    cand = np.flatnonzero(later.key_hash[pos] == seg.key_hash)
    if len(cand) == 0:
        return np.empty(0, np.int64)
    rows = seg.key_row[cand].astype(np.int64)
    encoded = [seg.key_at(r) for r in rows.tolist()]
    found = later.find_many(encoded, seg.key_hash[cand].astype(np.uint64, copy=False))
    return rows[found >= 0]


class Overlay:
    """Numbering of the live rows of ``segments`` (later segments win).

    Parameters
    ----------
    segments
        Oldest first.
    """

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = list(segments)
        self._done = False
        self._live: list[npt.NDArray[np.int64] | None] = []
        self._rank: list[npt.NDArray[np.int64] | None] = []
        self._offsets = np.zeros(1, np.int64)

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
        self._done = True

    @property
    def n(self) -> int:
        """Number of live rows (distinct keys)."""
        self._compute()
        return int(self._offsets[-1])

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
        out: npt.NDArray[np.int64] = (local if rank is None else rank[local]) + self._offsets[k]
        return out

    def one_to_global(self, k: int, local: int) -> int:
        """Map one live local row of segment ``k`` to its store row."""
        self._compute()
        rank = self._rank[k]
        return int(self._offsets[k]) + (local if rank is None else int(rank[local]))

    def locate(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
        """Map valid store rows to ``(segment index, local row)`` arrays."""
        self._compute()
        seg_of = np.searchsorted(self._offsets, rows, side="right") - 1
        local = rows - self._offsets[seg_of]
        for k in np.unique(seg_of).tolist():
            live = self._live[k]
            if live is not None:
                sel = seg_of == k
                local[sel] = live[local[sel]]
        return seg_of, local

    def locate_one(self, row: int) -> tuple[int, int]:
        """Map one valid store row to ``(segment index, local row)``."""
        self._compute()
        k = int(np.searchsorted(self._offsets, row, side="right")) - 1
        local = row - int(self._offsets[k])
        live = self._live[k]
        return k, local if live is None else int(live[local])

    def paths(self) -> list[str]:
        """Every live key, in store row order."""
        self._compute()
        out: list[str] = []
        for k, seg in enumerate(self.segments):
            keys = seg.key_list()
            live = self._live[k]
            out.extend(keys if live is None else [keys[i] for i in live.tolist()])
        return out
