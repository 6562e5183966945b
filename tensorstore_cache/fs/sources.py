"""The identity of a source file, taken before it is read: its stat, and its content's hash.

``stat`` calls run in a thread pool when they prove slow (they release the GIL), which
matters on network filesystems where one ``stat`` costs a round trip. A source modified
shortly before it was read is *racily clean* (git's term,
``Documentation/technical/racy-git.txt``): its content hash is taken too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt
import xxhash

__all__ = ["RACY_NS", "hash_file", "hash_many", "identify", "racy_since", "stat_many"]

#: A source modified less than this before the stat that preceded its read (or later) is
#: racily clean: its content hash is recorded too. Two seconds cover the coarsest
#: timestamps in use (FAT's 2 s, ext3's and HFS+'s 1 s) and modest clock skew with a
#: file server; on a local disk the tick is a few milliseconds.
RACY_NS = 2_000_000_000


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


def hash_file(key: str) -> int:
    """Return the XXH3-64 of the file ``key``'s bytes, ``0`` if it cannot be read."""
    digest = xxhash.xxh3_64()
    try:
        with open(key, "rb", buffering=0) as f:
            while block := f.read(1 << 20):
                digest.update(block)
    except (OSError, ValueError):
        return 0
    return digest.intdigest() or 1  # 0 means "unknown"


def _hash_chunk(keys: Sequence[str]) -> list[int]:
    return [hash_file(k) for k in keys]


def hash_many(keys: Sequence[str]) -> npt.NDArray[np.uint64]:
    """Return the XXH3-64 of every key's file content, ``0`` where it cannot be read."""
    out: list[int] = []
    with ThreadPoolExecutor(min(_THREADS, len(keys) // 64 + 1)) as pool:
        for part in pool.map(_hash_chunk, [keys[i : i + 64] for i in range(0, len(keys), 64)]):
            out.extend(part)
    return np.array(out, np.uint64)


def racy_since(stat_ns: int) -> int:
    """The first mtime (ns) at which a source stat'ed at ``stat_ns`` is racily clean: a later
    change within the filesystem's timestamp tick could leave its stat unchanged."""
    return stat_ns - RACY_NS


def identify(key: str, *, content: bool) -> tuple[int, int, int]:
    """Return ``(st_size, st_mtime_ns, content hash)`` of a source, before it is read.

    The hash (XXH3-64, ``0``: not taken) is taken when ``content`` is true,
    and for a racily clean source (modified less than :data:`RACY_NS` before
    this stat, or later). Size and time are ``-1`` when the source cannot be
    stat'ed.

    Examples
    --------
    >>> identify("/no/such/file", content=False)
    (-1, -1, 0)
    """
    now = time.time_ns()
    try:
        st = os.stat(key)
    except (OSError, ValueError):
        return -1, -1, 0
    racy = st.st_mtime_ns > now - RACY_NS
    return st.st_size, st.st_mtime_ns, hash_file(key) if content or racy else 0
