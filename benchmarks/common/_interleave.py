"""Interleaved rounds: every method once per round, each round in a rotated order.

A method measured once, between other methods' runs, takes whatever moment of a shared
machine it falls on; measured in rounds that take the methods in turn, and starting each
round with the next method, every method meets the machine's slower and faster moments
alike, and the median of its rounds is its figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["order", "spread", "summary"]


def order(names: Sequence[str], r: int) -> list[str]:
    """The methods in round ``r``: ``names`` rotated to start at its ``r``-th.

    Examples
    --------
    >>> [order(["a", "b", "c"], r) for r in range(4)]
    [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['a', 'b', 'c']]
    """
    if not names:
        return []
    k = r % len(names)
    return [*names[k:], *names[:k]]


def summary(values: Sequence[float | None]) -> dict[str, Any]:
    """``median_s``, ``min_s`` and ``max_s`` of the rounds that measured (None: failed)."""
    ok = [v for v in values if v is not None]
    return {"median_s": statistics.median(ok) if ok else None,
            "min_s": min(ok) if ok else None, "max_s": max(ok) if ok else None}


def spread(per: dict[str, Any]) -> str:
    """``(max - min) / median`` of a method's rounds, as a percentage; ``-`` without them."""
    med, lo, hi = per.get("median_s"), per.get("min_s"), per.get("max_s")
    if med is None or lo is None or hi is None or not med:
        return "-"
    return f"{(hi - lo) / med:.0%}"
