"""The key index of one store directory: which row holds a key.

Keys are found by their XXH3-64 in the sorted ``key_hash`` array, then
compared byte for byte with the stored key (``key_offsets`` into
``key_bytes``, in row order). A single lookup is a binary search of the mapped
hashes at C speed (``bisect`` over a memoryview: a guess of where a uniform hash
lies, corrected in Python, costs more than the whole search) within the hash's
bucket: the starts of at most 1,024 buckets, found at the first single lookup
(about 0.1 ms), the only thing built per process, of the same size whatever the
number of keys. A lookup of many keys is vectorised, the byte comparison
included: every candidate at once (:func:`all_same`), key by key
(:func:`same_bytes`) only when that fails.

The index arrays are checked where they are used (``O(1)`` per lookup), not
at open: a damaged index raises :class:`~tensorstore_cache.errors.CorruptStoreError`
instead of an ``IndexError`` or a wrong answer, and opening stays ``O(1)``.
"""

from __future__ import annotations

import bisect
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError
from ..format import KeyLayout, key_layout
from .sets import int_items

__all__ = ["KeyIndex", "all_same", "same_bytes"]

_bisect_left = bisect.bisect_left
#: Most hash buckets of a single lookup (a power of 2): their table, made once per process,
#: is 8 KiB at most, and a lookup bisects one bucket (about ``n / 1024`` hashes) instead
#: of all ``n``.
_BUCKETS = 1 << 10


#: Query bytes compared in one vectorised step of :func:`same_bytes`: its temporaries
#: (a few bytes per query byte, none larger than this) stay below glibc's initial mmap
#: threshold, so they are reused from the heap instead of raising the threshold and
#: growing the heap for good.
_COMPARE_BYTES = 96 << 10
#: Keys up to this many bytes are compared in fixed-width windows (:func:`_same_windows`);
#: longer ones, rare, byte by byte (:func:`_same_gathered`).
_WINDOW_BYTES = 256
#: Most windows per key of :func:`all_same` (the longest key over the shortest, rounded up).
_MAX_WINDOWS = 4


def all_same(
    stored: npt.NDArray[np.uint8],
    begin: npt.NDArray[np.int64],
    keys: KeyLayout,
) -> bool:
    """Whether ``stored[begin[i]:][:keys.lengths[i]]`` is key ``i`` of ``keys``, for every ``i``.

    One answer for all the keys (a lookup's candidates nearly always all
    match: their hashes do): every key is covered by a few windows as long as
    the shortest key, at offsets ``0, w, 2w, ...``, the last one ending where
    the key ends. Each window of every key is gathered from ``stored`` and from
    the keys' buffer as one item of ``w`` bytes (one copy, no mask), and the
    two gathers are compared as two ``bytes``, in steps of about
    :data:`_COMPARE_BYTES`. The spans must lie within ``stored`` (checked by
    the caller). False also when the lengths differ too much for
    :data:`_MAX_WINDOWS` windows, or a key is empty: :func:`same_bytes` then
    says which keys differ.
    """
    lengths = keys.lengths
    if len(lengths) == 0:
        return True
    width = int(lengths.min())
    windows = -(-int(lengths.max()) // width) if width else _MAX_WINDOWS + 1
    if windows > _MAX_WINDOWS:
        return False
    ours = _windows(stored, width, words=False)
    theirs = _windows(np.frombuffer(keys.joined, dtype=np.uint8), width, words=False)
    step = max(1, _COMPARE_BYTES // width)
    for a in range(0, len(lengths), step):
        b = min(a + step, len(lengths))
        here, there = (begin, keys.starts) if b - a == len(lengths) else (
            begin[a:b], keys.starts[a:b])
        for w in range(windows):
            if w:  # the next window, or the one ending with the key
                at = np.minimum(lengths[a:b] - width, w * width)
                here, there = begin[a:b] + at, keys.starts[a:b] + at
            # bytes compare with memcmp (memoryviews of numpy arrays compare item by item)
            if ours[here].tobytes() != theirs[there].tobytes():
                return False
    return True


def same_bytes(
    stored: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.uint64],
    stops: npt.NDArray[np.uint64],
    keys: Sequence[bytes],
) -> npt.NDArray[np.bool_]:
    """Whether ``stored[starts[i]:stops[i]] == keys[i]`` for every ``i``, vectorised.

    Keys of the same length as their candidate are compared in steps of about
    :data:`_COMPARE_BYTES`: no Python object per key (``starts``/``stops`` are
    within ``stored``, checked by the caller). A step compares fixed-width
    windows of the stored and the query bytes, one row per key, as 8-byte
    words (:func:`_same_windows`); keys longer than :data:`_WINDOW_BYTES`, and
    candidates too close to the end of ``stored`` for a whole window, are
    gathered byte by byte (:func:`_same_gathered`).
    """
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    begin = starts.astype(np.int64)
    same: npt.NDArray[np.bool_] = (stops.astype(np.int64) - begin) == lengths
    if len(keys) == 0:
        return same
    short = lengths <= _WINDOW_BYTES
    width = -(-int(lengths.max(initial=0, where=short)) // 8) * 8 or 8
    limit = len(stored) - width  # the last start of a whole window
    fits = short & same & (begin <= limit)
    if limit >= 0:
        # every key in one pass (no subset of the keys); the others' results are replaced
        _same_windows(stored, np.minimum(begin, limit), lengths, keys, width, same)
    rest = np.flatnonzero((stops.astype(np.int64) - begin == lengths) & ~fits)
    if len(rest):
        same[rest] = _same_gathered(stored, begin[rest], lengths[rest],
                                    [keys[i] for i in rest.tolist()])
    return same


def _same_windows(
    stored: npt.NDArray[np.uint8], begin: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
    keys: Sequence[bytes], width: int, same: npt.NDArray[np.bool_],
) -> None:
    """``same[i] &= stored[begin[i]:][:lengths[i]] == keys[i]``, for keys of at most
    ``width`` bytes (a multiple of 8) whose window ``stored[begin[i]:][:width]`` is whole.

    Each step gathers ``(keys, width)`` windows of ``stored`` and of the keys'
    joined bytes as rows of 8-byte words (one copy per key, no index per
    byte), XORs them, clears the bytes past each key's length (a mask row per
    length) and looks for a non-zero word.
    """
    windows = _windows(stored, width)
    keep = (np.arange(width) < np.arange(width + 1)[:, None]).astype(np.uint8)
    keep *= 0xFF
    masks = keep.view(np.uint64)  # masks[n]: the first n bytes of a window
    qstarts = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(lengths, out=qstarts[1:])
    step = max(1, _COMPARE_BYTES // width)
    for a in range(0, len(keys), step):
        b = min(a + step, len(keys))
        query = np.frombuffer(b"".join(keys[a:b]) + bytes(width), dtype=np.uint8)
        diff = windows[begin[a:b]]
        diff ^= _windows(query, width)[qstarts[a:b] - qstarts[a]]
        diff &= masks[np.minimum(lengths[a:b], width)]
        same[a:b] &= ~diff.any(axis=1)


def _windows(data: npt.NDArray[np.uint8], width: int, *, words: bool = True) -> npt.NDArray[Any]:
    """The read-only view of every window of ``width`` bytes of ``data`` (overlapping, one
    per byte): a row of ``width // 8`` (unaligned) 8-byte words each, or with ``words``
    false one item of ``width`` bytes each."""
    shape, dtype, strides = (
        ((len(data) - width + 1, width // 8), np.dtype(np.uint64), (1, 8)) if words
        else ((len(data) - width + 1,), np.dtype((np.void, width)), (1,))
    )
    view: npt.NDArray[Any] = np.ndarray(shape, dtype=dtype, buffer=data, strides=strides)
    view.flags.writeable = False
    return view


def _same_gathered(
    stored: npt.NDArray[np.uint8], begin: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
    keys: Sequence[bytes],
) -> npt.NDArray[np.bool_]:
    """Whether ``stored[begin[i]:][:lengths[i]] == keys[i]`` (lengths within ``stored``),
    gathering every byte by its own index (any length, any position)."""
    same = np.ones(len(keys), dtype=bool)
    ends = np.cumsum(lengths)
    cuts = np.searchsorted(ends, np.arange(_COMPARE_BYTES // 8, int(ends[-1]),
                                           _COMPARE_BYTES // 8))
    a = 0
    # the step ends, in order, once each (not np.unique: it imports numpy.ma, 0.5 MiB)
    for b in [*dict.fromkeys((cuts + 1).tolist()), len(keys)]:
        if b <= a:
            continue
        part = lengths[a:b]
        query = np.frombuffer(b"".join(keys[a:b]), dtype=np.uint8)
        qstarts = np.zeros(b - a, dtype=np.int64)
        np.cumsum(part[:-1], out=qstarts[1:])
        index = np.repeat(begin[a:b] - qstarts, part)
        index += np.arange(len(query), dtype=np.int64)
        equal = np.empty(len(query) + 1, dtype=bool)
        np.equal(stored.take(index, mode="clip"), query, out=equal[:-1])
        equal[-1] = True  # a start for an empty last key
        same[a:b] &= np.logical_and.reduceat(equal, qstarts)
        a = b
    return same


@dataclass(eq=False)
class KeyIndex:
    """The key index of a store directory: its four key arrays, mapped.

    Parameters
    ----------
    root
        The store directory (named in errors).
    n
        Its rows.
    key_hash, key_row, key_offsets, key_bytes
        The index arrays (see :mod:`tensorstore_cache.format.metadata`).
    """

    root: Path
    n: int
    key_hash: npt.NDArray[Any]
    key_row: npt.NDArray[Any]
    key_offsets: npt.NDArray[Any]
    key_bytes: npt.NDArray[Any]

    def __post_init__(self) -> None:
        self._hash_mv = int_items(self.key_hash, "Q")
        self._row_mv = int_items(self.key_row, "q")
        self._off_mv = int_items(self.key_offsets, "Q")
        self._kb_mv = self.key_bytes.data
        self._kb_len = len(self._kb_mv)
        mapped = getattr(self.key_bytes.base, "obj", None)
        #: what a single lookup slices a stored key from: the mapped file itself when the key
        #: bytes are all of it (its slice is bytes, compared by memcmp: cheaper than a view's)
        self._kb_slices: Any = (mapped if isinstance(mapped, mmap.mmap)
                                and len(mapped) == self._kb_len else self._kb_mv)
        #: The first position of every hash bucket and the shift that gives a key's bucket,
        #: made at the first single lookup (:meth:`_bucket_table`)
        self._buckets: tuple[Sequence[int], int] | None = None
        offsets: npt.NDArray[np.uint64] = np.ascontiguousarray(self.key_offsets, dtype=np.uint64)
        #: ``(start, stop)`` of every row's key bytes: overlapping rows of ``key_offsets``
        #: (made as ``_windows`` makes its views: ``as_strided`` costs far more)
        self._spans: npt.NDArray[np.uint64] = np.ndarray(
            (max(0, len(offsets) - 1), 2), dtype=np.uint64, buffer=offsets, strides=(8, 8))
        self._spans.flags.writeable = False

    def _bad_index(self, name: str, detail: str) -> CorruptStoreError:
        path = self.root / name / "c" / "0"
        return CorruptStoreError(
            f"{path}: {detail}; the store's index is damaged (run verify, then rebuild it)",
            str(path),
        )

    def _key_span(self, row: int) -> tuple[int, int]:
        off = self._off_mv
        start, stop = off[row], off[row + 1]
        if not start <= stop <= len(self._kb_mv):
            raise self._bad_index(
                "key_offsets", f"row {row} has key bytes [{start}, {stop}) outside the "
                f"{len(self._kb_mv)} stored"
            )
        return start, stop

    def key_at(self, row: int) -> bytes:
        """Return the stored key bytes of ``row``."""
        if not 0 <= row < self.n:
            raise IndexError(f"row {row} is out of range for {self.n} rows")
        start, stop = self._key_span(row)
        return bytes(self._kb_mv[start:stop])

    def _bucket_table(self) -> tuple[Sequence[int], int]:
        """The first position of each of at most :data:`_BUCKETS` hash buckets (by the top
        bits of a hash), and the shift that gives a hash's bucket: a few microseconds once,
        the same few kilobytes whatever the number of keys."""
        bits = max(0, min(_BUCKETS.bit_length() - 1, self.n.bit_length() - 1))
        shift = 64 - bits
        starts = np.empty((1 << bits) + 1, dtype=np.int64)
        starts[0], starts[-1] = 0, self.n
        edges = np.arange(1, 1 << bits, dtype=np.uint64) << np.uint64(shift % 64)
        starts[1:-1] = np.searchsorted(self.key_hash, edges, side="left")
        self._buckets = (int_items(starts, "q"), shift)
        return self._buckets

    def find(self, encoded: bytes, h: int) -> int:
        """Return the row of one key, or -1 (the single-lookup hot path)."""
        table, shift = self._buckets or self._bucket_table()
        bucket = h >> shift
        mv = self._hash_mv
        # C-speed over the mapped hashes of the key's bucket (cheaper than any guess)
        pos = _bisect_left(mv, h, table[bucket], table[bucket + 1])
        n, kb, off = self.n, self._kb_slices, self._off_mv
        while pos < n and mv[pos] == h:
            row = self._row_mv[pos]
            if not 0 <= row < n:
                raise self._bad_index("key_row", f"entry {pos} names row {row} of {n}")
            start = off[row]
            stop = off[row + 1]
            if not start <= stop <= self._kb_len:
                self._key_span(row)  # raises, naming the damage
            if kb[start:stop] == encoded:
                return row
            pos += 1
        return -1

    def find_many(
        self,
        encoded: Sequence[bytes],
        hashes: npt.NDArray[np.uint64],
        layout: KeyLayout | None = None,
    ) -> npt.NDArray[np.int64]:
        """Return the row of every key, -1 where absent.

        The search is vectorised, and so is the byte-for-byte comparison of
        every candidate with its stored key (all at once, then key by key if
        one differs); only hash collisions fall back to a scan. ``layout``
        holds the same keys joined (:func:`~tensorstore_cache.format.key_layout`
        of ``encoded`` when not given).
        """
        if self.n == 0 or len(encoded) == 0:
            return np.full(len(encoded), -1, dtype=np.int64)
        pos = np.searchsorted(self.key_hash, hashes, side="left")
        hit = self.key_hash.take(pos, mode="clip") == hashes
        if bool(hit.all()):  # the usual case: every key a candidate
            cand, mine = None, layout if layout is not None else key_layout(encoded)
        else:
            cand = np.flatnonzero(hit)
            if len(cand) == 0:
                return np.full(len(encoded), -1, dtype=np.int64)
            pos = pos[cand]
            mine = (layout if layout is not None else key_layout(encoded)).take(cand)
        rows: npt.NDArray[np.int64] = np.asarray(self.key_row[pos], dtype=np.int64)
        if int(rows.view(np.uint64).max()) >= self.n:  # a negative row too
            bad_row = int(rows[(rows < 0) | (rows >= self.n)][0])
            raise self._bad_index("key_row", f"an entry names row {bad_row} of {self.n}")
        spans = self._spans[rows]  # (start, stop) of each candidate's stored key
        starts_u, stops_u = spans[:, 0], spans[:, 1]
        if np.any(stops_u < starts_u) or int(stops_u.max()) > len(self.key_bytes):
            raise self._bad_index("key_offsets", "key offsets decrease or pass the key bytes")
        stored = np.asarray(self.key_bytes, dtype=np.uint8)
        if bool(((stops_u - starts_u).view(np.int64) == mine.lengths).all()) and all_same(
            stored, starts_u.view(np.int64), mine  # within the key bytes: no sign
        ):
            if cand is None:  # every key found: its rows are the answer
                return rows
            out = np.full(len(encoded), -1, dtype=np.int64)
            out[cand] = rows
            return out
        if cand is None:
            cand = np.arange(len(encoded))
        out = np.full(len(encoded), -1, dtype=np.int64)
        keys = encoded if len(cand) == len(encoded) else [encoded[i] for i in cand.tolist()]
        same = same_bytes(stored, starts_u, stops_u, keys)
        out[cand[same]] = rows[same]
        for i in cand[~same].tolist():  # hash collision (or a different key): scan
            out[i] = self.find(encoded[i], int(hashes[i]))
        return out

    def key_list(self) -> list[str]:
        """Return every key in row order (decodes all of them)."""
        offsets: npt.NDArray[np.uint64] = np.asarray(self.key_offsets, dtype=np.uint64)
        if self.n and (
            np.any(offsets[1:] <= offsets[:-1]) or int(offsets[-1]) > len(self.key_bytes)
        ):  # every key has at least one byte
            raise self._bad_index(
                "key_offsets", "key offsets do not increase or pass the key bytes"
            )
        raw = self.key_bytes.tobytes()
        if b"\x00" in raw:  # normalize_key never lets a NUL through
            raise self._bad_index("key_bytes", "a stored key contains a NUL byte")
        offs = offsets.tolist()
        return [
            raw[offs[i] : offs[i + 1]].decode("utf-8", "surrogateescape") for i in range(self.n)
        ]
