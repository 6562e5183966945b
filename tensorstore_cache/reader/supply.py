"""Shards on demand: what a segment asks of whoever makes its data files present.

A store whose data files are fetched when first read (a remote store's copy
in the node cache) gives each segment a :class:`ShardSupply`; the segment's
arrays ask it for every file they are about to map, all the files of one
batch at once, and give a file back when they unmap it. Files are named by
their id: their position in
:func:`~tensorstore_cache.format.metadata.fetched_files` (the shards of every
fixed field, ``vectors`` in format 1, where shard ``k`` has id ``k``; then the
``values`` chunks of every ragged or text field), so one supply serves every
field of a store of records. The remote layer implements it
(:class:`~tensorstore_cache.remote.shards.NodeShards`); the reader only knows
this protocol and what it reports (:class:`FetchStats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

__all__ = ["FetchStats", "ShardSupply"]


@dataclass
class FetchStats:
    """What one open store fetched into the node cache (``store.fetch_stats``)."""

    shards: int = 0
    """Files (shards, chunks of ragged values) downloaded by this process."""
    bytes: int = 0
    """Bytes of those files."""
    hits: int = 0
    """Files found already in the node cache (fetched by any process)."""
    refetched: int = 0
    """Files this process downloaded again after they were evicted."""
    cap: int | None = None
    """The node cache's cap in force (bytes), None if uncapped."""


class ShardSupply(Protocol):
    """Makes data files present before a segment maps them (files on demand, by id)."""

    stats: FetchStats
    """What was fetched so far."""

    @property
    def budget(self) -> int | None:
        """Most files a segment keeps mapped at once (None: no limit, rows are views); its
        arrays share it."""

    def ensure(self, shards: Sequence[int]) -> None:
        """Return once the files of ids ``shards`` are in place, complete (or raise)."""

    def prefetch(self, shards: Sequence[int], *, background: bool = False) -> Future[int]:
        """Fetch the files of ids ``shards`` ahead of reads; a future of the number downloaded."""

    def release(self, k: int) -> None:
        """File ``k`` is no longer mapped (one :meth:`ensure` of it is given back)."""

    def close(self) -> None:
        """The segment is closed: nothing more will be asked."""
