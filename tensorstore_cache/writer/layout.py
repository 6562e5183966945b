"""The shard layout of a build: how many rows each shard holds.

One rule for a store of tensors and a store of records alike (whose fixed
fields share their shard length, one shard task writing shard ``k`` of each):
about ``shard_bytes`` of the largest row per shard, fewer for small builds so
that each worker gets about 16 shards (8 for a batch loader), never fewer than
:func:`fewest_rows`, rounded down to whole pages, and to whole batches of a
batch loader, when there are that many rows.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

from .. import config

__all__ = ["fewest_rows", "rows_per_shard", "shard_rows"]

#: Shards a worker gets in a build small enough: progress moves shard by shard, and the shards
#: left near the end are cut into pieces (:mod:`.pieces`), so that the building process and
#: a worker end a piece apart; a batch loader's shards are whole batches, each a round trip to
#: a device worker, never cut: 8 of them (16 against 8 halved the gap at the end of a build
#: of whole shards: python -m benchmarks.cold.compare).
SHARDS_PER_WORKER, BATCHED_SHARDS_PER_WORKER = 16, 8
#: Linux's huge page (2 MiB with 4 KiB pages, x86-64 and arm64): a shard whose data is whole
#: huge pages, laid on a huge page by the reader, is mapped with the huge pages the page
#: cache holds (fewer TLB misses for a random batch: python -m benchmarks.run).
HUGE_PAGE = 2 << 20
#: Shards each process gets at least when they are whole huge pages.
HUGE_SHARDS_PER_WORKER = 4


def fewest_rows(n: int, batch: int = 1) -> int:
    """The fewest rows a shard of a build of ``n`` items is given before it is rounded to
    whole pages: :data:`~tensorstore_cache.config.MIN_SHARD_ROWS`, or one ``batch`` of a batch
    loader if larger (all ``n`` rows when there are fewer).

    Parameters
    ----------
    n
        The build's items.
    batch
        A batch loader's items per batch (1 for a loader of one key).

    Examples
    --------
    >>> fewest_rows(20_000), fewest_rows(20_000, batch=256), fewest_rows(10, batch=256)
    (64, 256, 10)
    """
    return max(min(n, config.MIN_SHARD_ROWS), min(n, batch))


def rows_per_shard(
    n: int, item_nbytes: int | Sequence[int], workers: int,
    shard_bytes: int = config.SHARD_BYTES, batch: int = 1,
) -> int:
    """Return the shard length of a store of ``n`` items built by ``workers`` processes.

    At most ``shard_bytes`` of the largest field's rows (at least one row),
    fewer for small builds so that each worker gets about
    :data:`SHARDS_PER_WORKER` shards (:data:`BATCHED_SHARDS_PER_WORKER` for a
    batch loader; never fewer than :func:`fewest_rows`, nor than a whole number
    of pages where half as many shards would hold one), rounded down to a multiple of
    ``PAGE / gcd(nbytes, PAGE)`` rows of every field when there are that
    many, so that every shard's data region is a whole number of pages (the
    reader lays shards side by side in one mapping only then), and to a
    multiple of ``batch`` too when there are that many, so that batches are
    whole. A loader of one key whose shards of whole huge pages
    (:data:`HUGE_PAGE`) fit ``shard_bytes`` and would give each process at
    least :data:`HUGE_SHARDS_PER_WORKER` of them gets shards of whole huge
    pages instead (its last shards are cut into pieces, so longer shards do
    not delay its end).

    Parameters
    ----------
    n
        The build's items.
    item_nbytes
        The bytes of one item (a store of tensors), or of one row of each
        fixed field (a store of records; none: only ragged fields).
    workers
        The build's worker processes.
    shard_bytes
        The target size of one shard file.
    batch
        A batch loader's items per batch (1 for a loader of one key).

    Examples
    --------
    >>> rows_per_shard(20_000, 512, 2), rows_per_shard(20_000, 512, 2, batch=256)
    (624, 1024)
    >>> rows_per_shard(20_000, [3072, 4], 2, 32 << 20)  # covers and a rating: whole pages
    1024
    >>> rows_per_shard(10_000, 3 * 32 * 32 * 4, 2)  # covers of 12 KiB: 6 MiB, 3 huge pages
    512
    """
    fixed = [item_nbytes] if isinstance(item_nbytes, int) else list(item_nbytes)
    cap = max(1, shard_bytes // max([*fixed, 1]))
    unit = 1
    for nbytes in fixed:
        unit = math.lcm(unit, mmap.PAGESIZE // math.gcd(max(nbytes, 1), mmap.PAGESIZE))
    # many shards per worker so that work balances at the end and progress moves, but no
    # tiny shards, and whole pages wherever half as many shards would have them
    per_worker = SHARDS_PER_WORKER if batch == 1 else BATCHED_SHARDS_PER_WORKER
    fewer = math.ceil(n / (per_worker // 2 * workers))
    rows = max(math.ceil(n / (per_worker * workers)), min(unit, fewer), fewest_rows(n, batch))
    rows = max(1, min(cap, rows))
    huge = 1
    for nbytes in fixed:
        huge = math.lcm(huge, HUGE_PAGE // math.gcd(max(nbytes, 1), HUGE_PAGE))
    if batch == 1 and fixed and huge <= cap and n >= HUGE_SHARDS_PER_WORKER * workers * huge:
        return max(huge, rows // huge * huge)
    whole = math.lcm(unit, batch)
    if batch > 1 and rows >= whole:
        return rows // whole * whole
    return rows // unit * unit if rows >= unit else rows


def shard_rows(n: int, rows_per_shard: int) -> list[range]:
    """The rows of each shard of a store of ``n`` rows, in shard order (the last may be short).

    Parameters
    ----------
    n
        The store's rows.
    rows_per_shard
        The shard length.

    Examples
    --------
    >>> shard_rows(5, 2)
    [range(0, 2), range(2, 4), range(4, 5)]
    """
    return [range(k, min(k + rows_per_shard, n)) for k in range(0, n, rows_per_shard)]
