"""Is a stored vector still the vector of its source? Source identity checks.

Every entry records its source's ``st_size`` and ``st_mtime_ns`` taken
*before* the loader read it (index arrays ``source_size`` and
``source_mtime_ns``, ``-1`` when the source could not be stat'ed, e.g. a key
that is not a file): a source rewritten while it was being loaded is seen as
stale by the next check. A part built with ``check="hash"`` also records an
XXH3-64 of every source's bytes, taken before the read too
(:mod:`tensorstore_cache.format.hashes`).

A source modified shortly before it was read is *racily clean* (git's term,
``Documentation/technical/racy-git.txt``): a second modification within the
same filesystem timestamp tick, at the same size, would leave its size and
mtime unchanged. Such entries (source modified less than :data:`RACY_NS`
before the stat that preceded its read, or in the future) get a content hash
too, taken before the read, and are re-checked by content whenever their
size and mtime still match. A store hands the recorded identity of its rows
out as a :class:`SourceIdentity`
(:meth:`~tensorstore_cache.CacheStore.source_identity`).

``stat`` calls run in a thread pool (they release the GIL), which matters on
network filesystems where one ``stat`` costs a round trip; the comparison is
vectorised.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import xxhash

from ..config import Check, IdentityKind, check_mode

__all__ = [
    "RACY_NS",
    "SourceIdentity",
    "hash_file",
    "hash_many",
    "identify",
    "Identity",
    "resolve_identity",
    "stale_mask",
    "stat_many",
    "token_map",
]

#: A source modified less than this before the stat that preceded its read (or later) is
#: racily clean: its content hash is recorded too. Two seconds cover the coarsest
#: timestamps in use (FAT's 2 s, ext3's and HFS+'s 1 s) and modest clock skew with a
#: file server; on a local disk the tick is a few milliseconds.
RACY_NS = 2_000_000_000


@dataclass(frozen=True, slots=True)
class SourceIdentity:
    """What was recorded about the sources of some rows when their vectors were computed."""

    size: npt.NDArray[np.int64]
    """``st_size`` of every source, -1 if it could not be stat'ed."""
    mtime_ns: npt.NDArray[np.int64]
    """``st_mtime_ns`` of every source, -1 if it could not be stat'ed."""
    content_hash: npt.NDArray[np.uint64] | None = None
    """XXH3-64 of every source's bytes (0: not recorded), when asked for."""
    recorded: npt.NDArray[np.str_] | None = None
    """What each row's store recorded (``"stat"``, ``"none"`` or ``"token"``; None: stat
    everywhere)."""

    def take(self, sel: npt.NDArray[np.intp]) -> SourceIdentity:
        """The identity of the rows at positions ``sel`` of these rows."""
        return SourceIdentity(
            size=self.size[sel],
            mtime_ns=self.mtime_ns[sel],
            content_hash=None if self.content_hash is None else self.content_hash[sel],
            recorded=None if self.recorded is None else self.recorded[sel],
        )

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


def stale_mask(
    keys: Sequence[str],
    recorded: SourceIdentity,
    *,
    check: Check | Literal["content", "none", "token"] = "stat",
    tokens: npt.NDArray[np.uint64] | None = None,
) -> npt.NDArray[np.bool_]:
    """Return which of ``keys`` are stale: their source differs from what was recorded.

    With ``check="stat"`` a source is stale when its size or modification
    time (ns) differs from the recorded one, or it no longer exists (or was
    no file when recorded); a row with a recorded content hash (a racily
    clean entry) whose size and time still match is also stale when its
    content hash differs. With ``check="hash"`` (or ``"content"``) a row with
    a recorded content hash is stale exactly when its content hash differs (a
    touched file is not); the others are judged as with ``"stat"``. With
    ``"token"`` a row is stale when its recorded version token differs from
    ``tokens``. With ``"none"`` nothing is stale (no system call is made).
    Rows recorded under another kind than the one checked are stale (once:
    they are recorded anew when recomputed).

    Parameters
    ----------
    keys
        Source paths.
    recorded
        Their recorded identity, in the same order (``content_hash`` None:
        judged by size and time alone).
    check
        ``"stat"``, ``"hash"``/``"content"``, ``"token"`` or ``"none"``.
    tokens
        With ``"token"``: every key's current version token.
    """
    n = len(keys)
    if check == "none":
        return np.zeros(n, bool)
    kinds = recorded.recorded
    if check == "token":
        if tokens is None:
            raise ValueError("check='token' needs the keys' current tokens")
        changed: npt.NDArray[np.bool_] = (
            recorded.mtime_ns.view(np.uint64) != np.asarray(tokens, np.uint64)
        )
        if kinds is not None:
            changed |= kinds != "token"
        return changed
    by_stat = np.ones(n, bool) if kinds is None else kinds == "stat"
    todo = np.flatnonzero(by_stat)
    stale = ~by_stat
    if len(todo) == 0:
        return stale
    subset = [keys[i] for i in todo.tolist()] if len(todo) != n else list(keys)
    size, mtime = stat_many(subset)
    got = (size != recorded.size[todo]) | (mtime != recorded.mtime_ns[todo])
    got |= recorded.size[todo] < 0  # recorded as no file (before identity="none" existed)
    hashes = recorded.content_hash
    if hashes is not None:
        sub_hashes = hashes[todo]
        has_hash = sub_hashes != 0
        by_content = check in ("hash", "content")
        known = np.flatnonzero(has_hash if by_content else has_hash & ~got)
        if len(known):
            current = hash_many([subset[i] for i in known.tolist()])
            got[known] = current != sub_hashes[known]
            if by_content:
                got[known] |= recorded.size[todo][known] < 0
    stale[todo] = got
    return stale


def token_map(keys: list[str], fn: Callable[[list[str]], npt.ArrayLike]) -> dict[str, int]:
    """Call an identity function once with ``keys``; its uint64 token of every key.

    Raises
    ------
    TypeError
        If it does not return one integer per key.
    """
    raw = np.asarray(fn(list(keys)))
    if raw.shape != (len(keys),) or raw.dtype.kind not in "iu":
        raise TypeError(
            f"identity= must return one integer token per key (a uint64 array of {len(keys)}), "
            f"got {raw.dtype} of shape {raw.shape}"
        )
    return dict(zip(keys, raw.astype(np.uint64, copy=False).tolist(), strict=True))


Identity = Literal["stat", "content", "none"] | Callable[[list[str]], npt.ArrayLike]
"""How a source's entry is known to be current (see :func:`cached`)."""


def resolve_identity(
    identity: Identity | None, check: Check | None
) -> tuple[Literal["stat", "content", "none", "token"], Callable[[list[str]], npt.ArrayLike] | None]:
    """``identity=`` (or its older name ``check=``) as ``(kind, token function or None)``.

    Raises
    ------
    TypeError
        If both are given, or ``identity`` is neither a kind nor a function.
    ValueError
        If a kind is unknown.
    """
    if identity is not None and check is not None:
        raise TypeError(
            "pass identity= or check= (its older name), not both: check='stat' is "
            "identity='stat', check='hash' is identity='content'"
        )
    if check is not None:
        check_mode("check", check, Check)
        return ("content" if check == "hash" else "stat"), None
    if identity is None:
        return "stat", None
    if callable(identity):
        return "token", identity
    if not isinstance(identity, str):
        raise TypeError(
            f"identity must be 'stat', 'content', 'none' or a function of the keys giving "
            f"uint64 version tokens, got {identity!r}"
        )
    check_mode("identity", identity, IdentityKind)
    return identity, None
