"""The distinct values of an integer array, without ``np.unique``.

``np.unique`` imports ``numpy.ma`` on its first call (about 15 ms in a fresh process, more
than opening a store and reading its first record together), so the reader's gathers, whose
first call is a process's first read, use :func:`distinct` instead.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["distinct"]

# below this many values a set of Python ints beats a sort
_SMALL = 64


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
