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

__all__ = ["apply_medians", "order", "spread", "summary"]


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


def summary(values: Sequence[float | None], unit: str = "s") -> dict[str, Any]:
    """``median_<unit>``, ``min_<unit>`` and ``max_<unit>`` of the rounds that measured
    (None: failed)."""
    ok = [v for v in values if v is not None]
    return {f"median_{unit}": statistics.median(ok) if ok else None,
            f"min_{unit}": min(ok) if ok else None, f"max_{unit}": max(ok) if ok else None}


def spread(per: dict[str, Any], unit: str = "s") -> str:
    """``(max - min) / median`` of a method's rounds (their :func:`summary` in ``unit``), as a
    percentage; ``-`` without them."""
    med, lo, hi = (per.get(f"{k}_{unit}") for k in ("median", "min", "max"))
    if med is None or lo is None or hi is None or not med:
        return "-"
    return f"{(hi - lo) / med:.0%}"


def apply_medians(results: dict[str, Any], rounds: dict[str, Any], figure: str, once: str,
                  median: str, own_round: str | None = None) -> None:
    """Make each method's ``figure`` the median of its rounds, the single measurement kept
    as ``once`` (once only: a resumed run applies them again).

    Parameters
    ----------
    results
        Each method's record, by name.
    rounds
        The rounds: ``{"methods": {name: {median: value or None, ...}}}``.
    figure, once
        The record's figure, and where its single measurement is kept.
    median
        The key of the median in each method's rounds.
    own_round
        A round of the record whose failure (a ``status`` other than ``ok``) stays the
        method's figure (None: none).
    """
    for name, per in rounds.get("methods", {}).items():
        rec = results.get(name)
        if rec is None or per.get(median) is None:
            continue
        if own_round is not None and rec.get("rounds", {}).get(own_round, {}).get(
                "status", "ok") != "ok":
            continue
        if once not in rec:
            rec[once] = rec.get(figure)
        rec[figure] = per[median]
