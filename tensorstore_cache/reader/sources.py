"""Is a stored vector still the vector of its source? Source identity checks.

Every entry records its source's ``st_size`` and ``st_mtime_ns`` at the time
it was loaded (index arrays ``source_size`` and ``source_mtime_ns``, ``-1``
when the source could not be stat'ed, e.g. a key that is not a file). A part
built with ``check="hash"`` also records an XXH3-64 of every source's bytes
(:mod:`tensorstore_cache.format.hashes`). A store hands the recorded identity
of its rows out as a :class:`SourceIdentity`
(:meth:`~tensorstore_cache.CacheStore.source_identity`).

``stat`` calls run in a thread pool (they release the GIL), which matters on
network filesystems where one ``stat`` costs a round trip; the comparison is
vectorised.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import xxhash

__all__ = ["SourceIdentity", "hash_many", "stale_mask", "stat_many"]


@dataclass(frozen=True, slots=True)
class SourceIdentity:
    """What was recorded about the sources of some rows when their vectors were computed."""

    size: npt.NDArray[np.int64]
    """``st_size`` of every source, -1 if it could not be stat'ed."""
    mtime_ns: npt.NDArray[np.int64]
    """``st_mtime_ns`` of every source, -1 if it could not be stat'ed."""
    content_hash: npt.NDArray[np.uint64] | None = None
    """XXH3-64 of every source's bytes (0: not recorded), when asked for."""

_CHUNK = 2048
_THREADS = 16
_SLOW_STAT_S = 50e-6  # slower than this per stat: a network filesystem, use threads


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


def stale_mask(keys: Sequence[str], recorded: SourceIdentity) -> npt.NDArray[np.bool_]:
    """Return which of ``keys`` are stale: their source differs from what was recorded.

    A source is stale when its size or modification time (ns) differs from
    the recorded one, or it no longer exists; with recorded content hashes,
    when its content hash differs (rows without a recorded hash are judged
    by size and time).

    Parameters
    ----------
    keys
        Source paths.
    recorded
        Their recorded identity, in the same order.
    """
    size, mtime = stat_many(keys)
    stale: npt.NDArray[np.bool_] = (size != recorded.size) | (mtime != recorded.mtime_ns)
    if recorded.content_hash is not None:
        known = np.flatnonzero(recorded.content_hash != 0)
        if len(known):
            current = hash_many([keys[i] for i in known.tolist()])
            stale[known] = current != recorded.content_hash[known]
    return stale
