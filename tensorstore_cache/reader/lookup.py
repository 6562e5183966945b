"""Path lookup: the rows of many paths at once, vectorised, in bounded steps."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..config import Missing, check_mode
from ..errors import KeyNotInStoreError
from ..format import encode_as_given, encode_keys_laid_out, path_sequence
from .overlay import Overlay

__all__ = ["find_rows"]

#: Keys looked up per vectorised step of :func:`find_rows` (their temporaries stay
#: small: a process keeps the heap that large temporaries grew).
_ROWS_CHUNK = 1024
#: Most bytes of paths per step of :func:`find_rows`: a step's temporaries (about one
#: byte each per byte of its paths) stay under glibc's initial mmap threshold (128 KiB), so
#: they are reused from the heap instead of growing it for good.
_ROWS_BYTES = 96 << 10
#: :func:`find_rows` of more than :data:`_ROWS_CHUNK` paths looks each distinct path
#: up once when at most this share of them are distinct (a ratings table's paths).
_REPEATS = 0.8


def find_rows(
    overlay: Overlay, paths: Iterable[Any], missing: Missing
) -> npt.NDArray[np.int64]:
    """Return the row of every path of ``paths`` in ``overlay`` (see ``CacheStore.rows``).

    Parameters
    ----------
    overlay
        The store's segments.
    paths
        Any iterable of paths, duplicates allowed.
    missing
        ``"raise"``: :class:`KeyNotInStoreError` naming every absent path;
        ``"ignore"``: -1 for them.
    """
    check_mode("missing", missing, Missing)
    values = path_sequence(paths)
    if len(values) > _ROWS_CHUNK and _repeats(values):  # look each distinct path up once
        first: dict[Any, int] = {}  # path -> where it first occurs
        try:  # one dict operation per path: where each path first occurs
            at = np.fromiter(map(first.setdefault, values, range(len(values))), np.int64,
                             len(values))
        except TypeError:  # an unhashable item: looked up (and refused) as it is
            return _rows(overlay, values, missing)
        if len(first) <= _REPEATS * len(values):
            found = np.empty(len(values), dtype=np.int64)  # filled where paths first occur
            found[np.fromiter(first.values(), np.int64, len(first))] = _rows(overlay,
                list(first), missing
            )
            return found[at]
    return _rows(overlay, values, missing)



def _rows(overlay: Overlay, values: Sequence[Any], missing: Missing) -> npt.NDArray[np.int64]:
    """:func:`find_rows` of a sequence of paths, in steps of at most :data:`_ROWS_CHUNK`."""
    out = np.empty(len(values), dtype=np.int64)
    missing_keys: list[str] = []
    # In chunks: the temporaries of a lookup grow with the keys' bytes, and a
    # process keeps freed heap, so one huge call would cost memory for good.
    step = _step(values)
    for start in range(0, len(values), step):
        part = values[start : start + step]
        found, absent = _find_chunk(overlay, part, named=missing == "raise")
        out[start : start + len(part)] = found
        missing_keys.extend(absent)
    if missing_keys:
        raise KeyNotInStoreError(missing_keys)
    return out

def _find_chunk(
    overlay: Overlay, part: Sequence[Any], named: bool
) -> tuple[npt.NDArray[np.int64], list[str]]:
    """The rows of a chunk of paths (-1 where absent) and, if ``named``, the keys of the
    absent ones.

    The paths are first looked up as they are (a path equal to a stored key
    is that key: :func:`~tensorstore_cache.format.encode_as_given`); only
    those not found are normalised (raising for a bad path) and, where that
    changes them, looked up again.
    """
    given = encode_as_given(part)
    if given is None:  # not all str, or a NUL: normalised (or refused) first
        keys, encoded, layout = encode_keys_laid_out(part)
        found = overlay.find_many(encoded, layout)
        return found, _absent(keys, found, named)
    found = overlay.find_many(*given)
    if bool(found.min() >= 0):
        return found, []
    miss = np.flatnonzero(found < 0)
    unfound = [part[i] for i in miss.tolist()]
    keys, encoded, layout = encode_keys_laid_out(unfound)
    if keys is not unfound:  # some are not their own key: look the keys up
        found[miss] = again = overlay.find_many(encoded, layout)
        return found, _absent(keys, again, named)
    return found, [str(k) for k in keys] if named else []

def _step(values: Sequence[Any]) -> int:
    """Paths per step of :func:`find_rows`: :data:`_ROWS_CHUNK`, fewer for long paths
    (their mean length estimated from a sample), so a step's paths hold about
    :data:`_ROWS_BYTES` at most."""
    sample = [v for v in values[:: max(1, len(values) // 16)][:16] if isinstance(v, str)]
    if not sample:
        return _ROWS_CHUNK
    mean = sum(map(len, sample)) / len(sample)
    return max(64, min(_ROWS_CHUNK, int(_ROWS_BYTES // max(mean + 1.0, 1.0))))


def _absent(keys: Sequence[Any], found: npt.NDArray[np.int64], named: bool) -> list[str]:
    """The keys not found (``found < 0``), if they are to be ``named``."""
    if not named:
        return []
    return [str(keys[i]) for i in np.flatnonzero(found < 0).tolist()]


def _repeats(values: Sequence[Any]) -> bool:
    """Whether a sample of about :data:`_ROWS_CHUNK` of ``values``, evenly spaced, repeats a
    value (paths of a ratings table do; distinct keys never cost a dict of them all)."""
    sample = values[:: len(values) // _ROWS_CHUNK]
    try:
        return len(set(sample)) < len(sample)
    except TypeError:  # an unhashable item: looked up (and refused) as it is
        return False
