"""Our own random arithmetic: splitmix64, identical on every machine and numpy build.

numpy guarantees a ``Generator``'s stream only on the same build, environment
and machine (NEP 19), so an order that a run on another machine must
reproduce (an elastic resume) comes from this integer arithmetic instead:
Steele, Lea and Flood's splitmix64 finaliser, in plain Python integers for
one value and in wrapping ``uint64`` numpy arithmetic for a whole array.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["mix", "permutation", "splitmix64"]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def splitmix64(z: int) -> int:
    """The splitmix64 finaliser of one 64-bit value (a bijection of ``[0, 2**64)``)."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def mix(*words: int) -> int:
    """A 64-bit value that depends on every word, in order (each reduced modulo ``2**64``)."""
    h = 0
    for w in words:
        h = splitmix64(h ^ splitmix64((w + _GOLDEN) & _MASK))
    return h


def _finalise(z: npt.NDArray[np.uint64]) -> None:
    """:func:`splitmix64` of every element, in place (numpy's uint64 arithmetic wraps)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(_M1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_M2)
    z ^= z >> np.uint64(31)


def permutation(n: int, key: int) -> npt.NDArray[np.int64]:
    """A permutation of ``range(n)`` determined by ``key`` alone.

    Element ``i`` gets the ``i``-th splitmix64 output of the stream that starts
    at ``key``; the permutation is the stable argsort of those values' top bits.
    The low ``ceil(log2 n)`` bits are replaced by ``i`` itself, which makes
    every sort key distinct and breaks ties by index (what a stable sort does),
    so one in-place ``sort`` of the keys gives the permutation in its low bits,
    whatever the sort algorithm.
    """
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    z = np.arange(1, n + 1, dtype=np.uint64)
    z *= np.uint64(_GOLDEN)
    z += np.uint64(key & _MASK)
    _finalise(z)
    low = np.uint64((1 << max(1, (n - 1).bit_length())) - 1)
    z &= ~low
    z |= np.arange(n, dtype=np.uint64)
    z.sort()
    z &= low
    return z.view(np.int64)
