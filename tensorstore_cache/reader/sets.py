"""Integer arrays as the reader's hot paths need them: their distinct values without
``np.unique``, their bounds without a NumPy call when they are few (and by one pass when they
are many), and their items as Python ints without a NumPy call per item.

``np.unique`` imports ``numpy.ma`` on its first call (about 15 ms in a fresh process, more
than opening a store and reading its first record together), so the reader's gathers, whose
first call is a process's first read, use :func:`distinct` instead. Indexing an array for
one item costs a NumPy scalar; :func:`int_items` gives a sequence whose items are ints.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["FEW", "distinct", "int_bounds", "int_items", "within"]

# below this many values a set of Python ints beats a sort
_SMALL = 64

#: A batch of at most this many rows is read row by row, in Python: NumPy's vectorised
#: gathers cost more for it, and their first calls in a process (each array function and
#: ufunc pays tens of microseconds once) more than the whole read.
FEW = 16


def distinct(values: npt.NDArray[np.integer]) -> list[int]:
    """The distinct values of the 1-d integer array ``values``, ascending, as ints.

    Examples
    --------
    >>> distinct(np.array([3, 1, 3, 2]))
    [1, 2, 3]
    """
    if len(values) <= _SMALL:
        return sorted(set(values.tolist()))
    ordered = np.sort(values)
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    out: list[int] = ordered[keep].tolist()
    return out


def int_bounds(values: npt.NDArray[np.integer]) -> tuple[int, int]:
    """The least and the greatest of the non-empty 1-d integer array ``values``, as ints:
    a few values by Python's ``min`` and ``max`` (a NumPy reduction's first call in a
    process costs more than a small batch's whole read), more by NumPy.

    Examples
    --------
    >>> int_bounds(np.array([3, 1, 2]))
    (1, 3)
    """
    if len(values) <= _SMALL:
        items = values.tolist()
        return min(items), max(items)
    return int(values.min()), int(values.max())


def within(values: npt.NDArray[np.integer], n: int) -> bool:
    """Whether every value of the non-empty 1-d integer array ``values`` is in ``[0, n)``: a
    few values by Python's ``min`` and ``max``, ``int64`` ones by one ``argmax`` of their
    unsigned view (as unsigned, a negative value is larger than any ``n``; ``argmax`` runs
    less code than the ufunc machinery of ``max``, which a batch's copy leaves cold), others
    by two reductions.

    Examples
    --------
    >>> within(np.array([3, 0]), 4), within(np.array([-1] * 100), 4)
    (True, False)
    """
    if len(values) > _SMALL and values.dtype == np.int64:
        unsigned = values.view(np.uint64)
        return int(unsigned[unsigned.argmax()]) < n
    lo, hi = int_bounds(values)  # before a cast to int64 wraps a large unsigned value
    return lo >= 0 and hi < n


def int_items(array: npt.NDArray[np.generic], code: Literal["Q", "q"]) -> Sequence[int]:
    """A sequence of Python ints over the 1-d little-endian 8-byte integer ``array``
    (``code``: ``"Q"`` unsigned, ``"q"`` signed): a memoryview (C-speed indexing and
    bisection, no copy) on little-endian hosts, whose byte order store files share; a
    list elsewhere.

    Examples
    --------
    >>> int_items(np.array([5, 7], dtype="<u8"), "Q")[1]
    7
    """
    if sys.byteorder == "little":
        return array.view(np.uint8).data.cast(code)
    return list(array.tolist())
