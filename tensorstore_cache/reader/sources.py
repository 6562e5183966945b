"""Is a stored vector still the vector of its source? Source identity checks.

Every entry records its source's ``st_size`` and ``st_mtime_ns`` taken
*before* the loader read it (index arrays ``source_size`` and
``source_mtime_ns``, ``-1`` when the source could not be stat'ed, e.g. a key
that is not a file): a source rewritten while it was being loaded is seen as
stale by the next check. A part built with ``identity="content"`` also records an
XXH3-64 of every source's bytes, taken before the read too
(:mod:`tensorstore_cache.format.hashes`).

A source modified shortly before it was read is *racily clean* (git's term,
``Documentation/technical/racy-git.txt``): a second modification within the
same filesystem timestamp tick, at the same size, would leave its size and
mtime unchanged. Such entries (source modified less than ``fs.RACY_NS``
before the stat that preceded its read, or in the future) get a content hash
too, taken before the read, and are re-checked by content whenever their
size and mtime still match. A store hands the recorded identity of its rows
out as a :class:`SourceIdentity`
(:meth:`~tensorstore_cache.reader.view.StoreView.source_identity`).

The sources are stat'ed and hashed by :mod:`tensorstore_cache.fs.sources`; the
comparison is vectorised.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, get_args

import numpy as np
import numpy.typing as npt

from ..config import Identity, IdentityKind, SourceCheck, check_mode
from ..fs import hash_many, racy_since, stat_many

__all__ = ["SeenSources", "SourceIdentity", "resolve_identity", "stale_mask", "token_map"]


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

class SeenSources(Protocol):
    """What this machine found by reading sources: the stat of a source whose bytes had a
    given content hash (its own copy of a source recorded with another stat elsewhere)."""

    def lookup(
        self, keys: Sequence[str]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
        """``(size, mtime_ns, content hash)`` seen of every key (``-1, -1, 0``: none)."""

    def learn(
        self, keys: Sequence[str], size: npt.NDArray[np.int64], mtime_ns: npt.NDArray[np.int64],
        content_hash: npt.NDArray[np.uint64],
    ) -> None:
        """Remember that these keys had these bytes at this stat."""


def stale_mask(
    keys: Sequence[str],
    recorded: SourceIdentity,
    *,
    check: SourceCheck = "stat",
    tokens: npt.NDArray[np.uint64] | None = None,
    seen: SeenSources | None = None,
) -> npt.NDArray[np.bool_]:
    """Return which of ``keys`` are stale: their source differs from what was recorded.

    With ``check="stat"`` a source is stale when its size or modification
    time (ns) differs from the recorded one, or it no longer exists (or was
    no file when recorded); a row with a recorded content hash (a racily
    clean entry) whose size and time still match is also stale when its
    content hash differs. With ``check="content"`` a row with
    a recorded content hash is stale exactly when its content hash differs (a
    touched file is not); the others are judged as with ``"stat"``. With
    ``"token"`` a row is stale when its recorded version token differs from
    ``tokens``. With ``"none"`` nothing is stale (no system call is made).
    Rows recorded under another kind than the one checked are stale (once:
    they are recorded anew when recomputed).

    With ``seen`` (the sources are copies, each machine's with its own
    mtimes, and every row has a recorded content hash), a ``"stat"`` row with
    a recorded hash is current exactly when its bytes hash the same, whatever
    its stat: ``seen`` is asked first (a stat it saw with that hash costs no
    read), else the source is read once, and a match is remembered in
    ``seen`` unless the source was modified too recently for its stat to tell
    a later change (:func:`~tensorstore_cache.fs.racy_since`).

    Parameters
    ----------
    keys
        Source paths.
    recorded
        Their recorded identity, in the same order (``content_hash`` None:
        judged by size and time alone).
    check
        ``"stat"``, ``"content"``, ``"token"`` or ``"none"``.
    tokens
        With ``"token"``: every key's current version token.
    seen
        This machine's stats of sources found by content (None: a differing
        stat is stale).
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
    stat_time = time.time_ns()
    size, mtime = stat_many(subset)
    got = (size != recorded.size[todo]) | (mtime != recorded.mtime_ns[todo])
    got |= recorded.size[todo] < 0  # recorded as no file (before identity="none" existed)
    hashes = recorded.content_hash
    if hashes is not None:
        sub_hashes = hashes[todo]
        has_hash = sub_hashes != 0
        by_content = check == "content"
        if seen is not None and not by_content:  # every row hashed: judged by its bytes
            hashed = np.flatnonzero(has_hash & (size >= 0))
            if len(hashed):
                got[hashed] = ~_same_bytes(subset, hashed, size, mtime, sub_hashes, seen,
                                           racy_since(stat_time))
        else:
            known = np.flatnonzero(has_hash if by_content else has_hash & ~got)
            if len(known):
                current = hash_many([subset[i] for i in known.tolist()])
                got[known] = current != sub_hashes[known]
                if by_content:
                    got[known] |= recorded.size[todo][known] < 0
    stale[todo] = got
    return stale


def _same_bytes(
    keys: Sequence[str],
    rows: npt.NDArray[np.intp],
    size: npt.NDArray[np.int64],
    mtime: npt.NDArray[np.int64],
    hashes: npt.NDArray[np.uint64],
    seen: SeenSources,
    settled_ns: int,
) -> npt.NDArray[np.bool_]:
    """Which ``rows`` hold the recorded bytes:
    by what ``seen`` saw at the same stat, else by reading them; remember those read and
    found the same, unless modified after ``settled_ns``."""
    names = [keys[i] for i in rows.tolist()]
    s, m, h = seen.lookup(names)
    same: npt.NDArray[np.bool_] = (s == size[rows]) & (m == mtime[rows]) & (h == hashes[rows])
    unread = np.flatnonzero(~same)
    if len(unread):
        current = hash_many([names[i] for i in unread.tolist()])
        match = current == hashes[rows[unread]]
        same[unread] = match
        learn = unread[match & (mtime[rows[unread]] < settled_ns)]
        if len(learn):
            seen.learn([names[i] for i in learn.tolist()], size[rows[learn]],
                       mtime[rows[learn]], hashes[rows[learn]])
    return same


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


def resolve_identity(
    identity: Identity | None,
) -> tuple[SourceCheck, Callable[[list[str]], npt.ArrayLike] | None]:
    """``identity=`` as ``(kind, token function or None)``; None is ``"stat"``.

    Raises
    ------
    TypeError
        If ``identity`` is neither a kind nor a function.
    ValueError
        If a kind is unknown.
    """
    if identity is None:
        return "stat", None
    if callable(identity):
        return "token", identity
    if not isinstance(identity, str):
        raise TypeError(
            f"identity must be {', '.join(map(repr, get_args(IdentityKind)))} or a function of "
            f"the keys giving uint64 version tokens, got {identity!r}"
        )
    check_mode("identity", identity, IdentityKind)
    return identity, None
