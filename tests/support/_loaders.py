"""Small loaders shared by the tests: a cheap vector of a numbered key, no decoding.

A test key carries its number after its last ``k`` (``k12``, ``src/k0007.bin``).
:class:`Filled` instances are picklable by reference (their class lives in an
importable module), so worker processes, forked or spawned, run them as the
test process does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Filled", "key_number"]

_NUMBER = re.compile(r"\d+")


def key_number(key: str) -> int:
    """The number of a test key: the digits right after its last ``k``.

    >>> key_number("k12"), key_number("src/k0007.bin")
    (12, 7)
    """
    found = _NUMBER.match(key.rsplit("k", 1)[-1])
    if found is None:
        raise ValueError(f"the test key {key!r} has no number after its last 'k'")
    return int(found.group())


@dataclass(frozen=True, slots=True)
class Filled:
    """A loader: an array of ``shape`` filled with ``sign * (key_number(key) + offset)``.

    It declares no ``item_shape``: a build probes its first item, as for any
    plain function.
    """

    shape: tuple[int, ...] = (4,)
    """Shape of every vector."""
    offset: int = 0
    """Added to the key's number (1: no vector is all zeros)."""
    sign: int = 1
    """-1 gives other vectors for the same keys (a newer build)."""
    dtype: str = "float32"
    """Element type."""

    def __call__(self, key: str) -> npt.NDArray[Any]:
        return np.full(self.shape, self.sign * (key_number(key) + self.offset), dtype=self.dtype)
