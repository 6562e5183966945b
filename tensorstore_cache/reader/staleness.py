"""The one staleness rule: which keys of a store are stale, as ``CacheStore.stale()`` and
``cached()``'s planning both ask."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ..config import SourceCheck
from .sources import SeenSources, stale_mask
from .view import StoreView

__all__ = ["stale_keys"]


def stale_keys(
    view: StoreView,
    keys: Sequence[str],
    rows: npt.NDArray[np.int64],
    *,
    kind: SourceCheck | None,
    tokens: Callable[[list[str]], Mapping[str, int]] | None = None,
    seen: SeenSources | None = None,
) -> list[str]:
    """Return the keys of ``keys`` held by ``view`` whose source changed, in order.

    Parameters
    ----------
    view
        The store.
    keys
        Distinct normalised keys.
    rows
        Their rows in ``view`` (-1: not held, never stale).
    kind
        How to compare: ``"stat"``, ``"content"``, ``"token"`` or ``"none"``
        (nothing is stale, no system call); None: each entry the way it was
        recorded (by stat, never stale if built with ``identity="none"``).
        Entries recorded under another kind than ``kind`` are stale.
    tokens
        With ``"token"``: gives the current version token of the keys it is
        called with (those held).
    seen
        With ``"stat"``: this machine's stats of sources found by content, for
        sources copied to each machine (see
        :func:`~tensorstore_cache.reader.sources.stale_mask`).

    Raises
    ------
    TypeError
        With ``kind=None``, if entries were recorded with version tokens (their
        function is needed to judge them).
    """
    present = np.flatnonzero(rows >= 0)
    if kind == "none" or len(present) == 0:
        return []
    if kind is None and all(seg.spec.identity == "none" for seg in view.segments):
        return []  # built with identity="none": nothing is ever stale
    recorded = view.source_identity(rows[present], content_hash=kind != "token")
    if kind is None:  # each entry judged the way it was recorded
        kinds = recorded.recorded
        assert kinds is not None
        if bool(np.any(kinds == "token")):
            raise TypeError(
                f"entries of {view.location!r} were recorded with version tokens: pass "
                "identity=<the function of the keys giving their tokens> to check them"
            )
        judged = np.flatnonzero(kinds != "none")
        present = present[judged]
        recorded = recorded.take(judged)
    found = [keys[i] for i in present.tolist()]
    current = None
    if kind == "token":
        assert tokens is not None
        by_key = tokens(found)
        current = np.array([by_key[k] for k in found], np.uint64)
    mask = stale_mask(found, recorded, check="stat" if kind is None else kind, tokens=current,
                      seen=seen)
    return [found[i] for i in np.flatnonzero(mask).tolist()]
