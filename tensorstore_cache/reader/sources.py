"""Is a cached vector still the vector of its source? Source identity checks.

Every entry records its source's ``st_size`` and ``st_mtime_ns`` at the time
it was loaded (index arrays ``source_size`` and ``source_mtime_ns``, ``-1``
when the source could not be stat'ed, e.g. a key that is not a file). A part
built with ``check="hash"`` also records an XXH3-64 of every source's bytes in
a side file ``<part>.source_xxh3`` (``n`` little-endian ``uint64`` in row
order, ``0`` meaning "unknown") next to the part directory.

``stat`` calls run in a thread pool (they release the GIL), which matters on
network filesystems where one ``stat`` costs a round trip; the comparison is
vectorised.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import xxhash

from ..errors import CorruptStoreError
from ..fs.durable import fsync_dir, write_bytes_durable
from .segment import Segment

if TYPE_CHECKING:
    from .store import CacheStore

__all__ = [
    "CHECKS",
    "HASH_SUFFIX",
    "hash_many",
    "recorded_hashes",
    "stale_keys",
    "stale_mask",
    "stat_many",
    "write_hashes",
]

#: Accepted values of ``check``.
CHECKS = ("stat", "hash")
#: Suffix of the side file holding the content hashes of a part.
HASH_SUFFIX = ".source_xxh3"

_CHUNK = 2048
_THREADS = 16
_SLOW_STAT_S = 50e-6  # slower than this per stat: a network filesystem, use threads
_hash_cache: weakref.WeakKeyDictionary[Segment, npt.NDArray[np.uint64] | None] = (
    weakref.WeakKeyDictionary()
)


def _stat_chunk(keys: Sequence[str]) -> tuple[list[int], list[int]]:
    sizes: list[int] = []
    mtimes: list[int] = []
    stat = os.stat
    for key in keys:
        try:
            st = stat(key)
        except (OSError, ValueError):
            sizes.append(-1)
            mtimes.append(-1)
        else:
            sizes.append(st.st_size)
            mtimes.append(st.st_mtime_ns)
    return sizes, mtimes


def _chunked(keys: Sequence[str]) -> list[Sequence[str]]:
    return [keys[i : i + _CHUNK] for i in range(0, len(keys), _CHUNK)]


def stat_many(keys: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Return ``(st_size, st_mtime_ns)`` of every key, ``-1`` where it cannot be stat'ed.

    The first block is stat'ed in this thread; if a ``stat`` proved slow
    (a network filesystem: a round trip each), the rest runs in a thread
    pool, else in this thread too (on a local disk threads only add
    contention for the GIL).
    """
    start = time.perf_counter()
    sizes, mtimes = _stat_chunk(keys[:_CHUNK])
    rest = keys[_CHUNK:]
    if rest:
        per_stat = (time.perf_counter() - start) / _CHUNK
        if per_stat < _SLOW_STAT_S:
            s, m = _stat_chunk(rest)
            sizes.extend(s)
            mtimes.extend(m)
        else:
            with ThreadPoolExecutor(min(_THREADS, len(rest) // _CHUNK + 1)) as pool:
                for s, m in pool.map(_stat_chunk, _chunked(rest)):
                    sizes.extend(s)
                    mtimes.extend(m)
    return np.array(sizes, np.int64), np.array(mtimes, np.int64)


def _hash_file(key: str) -> int:
    digest = xxhash.xxh3_64()
    try:
        with open(key, "rb", buffering=0) as f:
            while block := f.read(1 << 20):
                digest.update(block)
    except (OSError, ValueError):
        return 0
    return digest.intdigest() or 1  # 0 means "unknown"


def _hash_chunk(keys: Sequence[str]) -> list[int]:
    return [_hash_file(k) for k in keys]


def hash_many(keys: Sequence[str]) -> npt.NDArray[np.uint64]:
    """Return the XXH3-64 of every key's file content, ``0`` where it cannot be read."""
    out: list[int] = []
    with ThreadPoolExecutor(min(_THREADS, len(keys) // 64 + 1)) as pool:
        for part in pool.map(_hash_chunk, [keys[i : i + 64] for i in range(0, len(keys), 64)]):
            out.extend(part)
    return np.array(out, np.uint64)


def hash_path(root: Path) -> Path:
    """Return the hash side file of the part at ``root``."""
    return root.with_name(root.name + HASH_SUFFIX)


def write_hashes(root: Path, hashes: npt.NDArray[np.uint64]) -> None:
    """Write the hash side file of the part at ``root`` (hashes in row order), durably."""
    write_bytes_durable(hash_path(root), np.ascontiguousarray(hashes, "<u8").tobytes())
    fsync_dir(root.parent)


def recorded_hashes(seg: Segment) -> npt.NDArray[np.uint64] | None:
    """Return the recorded content hashes of ``seg``'s rows, or None if it has none."""
    if seg in _hash_cache:
        return _hash_cache[seg]
    path = hash_path(seg.root)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        hashes = None
    except OSError as exc:
        raise CorruptStoreError(f"{path} cannot be read: {exc}", str(path)) from None
    else:
        if len(raw) != 8 * seg.n:
            raise CorruptStoreError(
                f"{path} is {len(raw)} bytes but its part holds {seg.n} entries "
                f"({8 * seg.n} bytes expected); delete it (its entries fall back to stat checks)",
                str(path),
            )
        hashes = np.frombuffer(raw, "<u8").astype(np.uint64)
    _hash_cache[seg] = hashes
    return hashes


def _recorded(
    store: CacheStore, rows: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[tuple[int, npt.NDArray[np.intp], npt.NDArray[np.int64]]]]:
    """Recorded size and mtime of store rows, and the rows grouped by segment."""
    segments = store._segments
    if store._single is not None:
        seg_of = np.zeros(len(rows), np.intp)
        local = rows
    else:
        seg_of, local = store._overlay_().locate(rows)
    sizes = np.empty(len(rows), np.int64)
    mtimes = np.empty(len(rows), np.int64)
    groups = []
    for k in np.unique(seg_of).tolist():
        sel = np.flatnonzero(seg_of == k)
        seg = segments[k]
        sizes[sel] = seg.source_size[local[sel]]
        mtimes[sel] = seg.source_mtime_ns[local[sel]]
        groups.append((k, sel, local[sel]))
    return sizes, mtimes, groups


def stale_mask(
    store: CacheStore, keys: Sequence[str], rows: npt.NDArray[np.int64], *, check: str = "stat"
) -> npt.NDArray[np.bool_]:
    """Return which of ``keys`` (found at store ``rows``) are stale.

    Parameters
    ----------
    store
        The open store.
    keys
        Keys present in the store.
    rows
        Their rows (from ``store.rows``).
    check
        ``"stat"`` or ``"hash"`` (see :meth:`CacheStore.stale`).
    """
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    rec_size, rec_mtime, groups = _recorded(store, rows)
    size, mtime = stat_many(keys)
    stale: npt.NDArray[np.bool_] = (size != rec_size) | (mtime != rec_mtime)
    if check == "hash":
        recorded = np.zeros(len(keys), np.uint64)
        for k, sel, local in groups:
            hashes = recorded_hashes(store._segments[k])
            if hashes is not None:
                recorded[sel] = hashes[local]
        known = np.flatnonzero(recorded != 0)
        if len(known):
            current = hash_many([keys[i] for i in known.tolist()])
            stale[known] = current != recorded[known]
    return stale


def stale_keys(store: CacheStore, keys: Sequence[str], *, check: str = "stat") -> list[str]:
    """Return the keys among ``keys`` whose source changed (keys not in the store are skipped)."""
    rows = store.rows(keys, missing="ignore")
    present = np.flatnonzero(rows >= 0)
    found = [keys[i] for i in present.tolist()]
    mask = stale_mask(store, found, rows[present], check=check)
    return [found[i] for i in np.flatnonzero(mask).tolist()]
