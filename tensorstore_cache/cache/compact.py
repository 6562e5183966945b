"""Compaction: when to merge several parts of a namespace into one new part.

The merge itself is the writer's (:func:`~tensorstore_cache.writer.merge.write_merged`):
entries are copied, never recomputed, with the source identity recorded when they were
computed. The parts it replaces stay on disk until housekeeping removes them, so readers
that map them are never disturbed.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_PARTS", "MAX_WASTE", "merge_start"]

#: More live parts than this triggers a merge.
MAX_PARTS = 8
#: More than this fraction of overridden (dead) rows triggers a full merge.
MAX_WASTE = 0.25


def merge_start(part_rows: Sequence[int], dead_rows: int) -> int | None:
    """Return the index of the first part of the suffix to merge, or None if merging does not pay.

    Dead rows above :data:`MAX_WASTE` of all rows merge everything (the only
    way to drop them). More than :data:`MAX_PARTS` parts merge the parts that
    follow the biggest one (usually the small increments after a large first
    build), or everything if that would not bring the count down enough.
    """
    total = sum(part_rows)
    if len(part_rows) > 1 and total and dead_rows / total > MAX_WASTE:
        return 0
    if len(part_rows) <= MAX_PARTS:
        return None
    big = max(range(len(part_rows)), key=lambda i: (part_rows[i], -i))
    start = big + 1
    if len(part_rows) - start >= 2 and start + 1 <= MAX_PARTS:
        return start
    return 0
