"""A remote store's copy in the node cache, as a location: opened, pickled, opened again.

:func:`open_url` fetches a version's metadata and index into the node cache
(:func:`~tensorstore_cache.remote.fetch.fetch_store`) and opens it: the
version is held first (no evictor deletes a version a process holds), then
the reader maps it with a :class:`~tensorstore_cache.remote.shards.NodeShards`
supply that fetches each shard when it is first read. The URL's directory in
the node cache is opened and checked once, and the version's metadata is
read once (by the reader, which hands it to the supply).

The store's location is a :class:`NodeCopy`: pickled into another process,
the store opens this node's copy again when it exists (no request), else the
URL.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import StoreNotFoundError
from ..format import GROUP, GroupMetadata
from ..fs import RangeHolds, Trust
from ..reader import CacheStore, SegmentSource, assemble
from .fetch import fetch_store
from .node_cache import HOLDS_SUFFIX
from .shards import NodeShards
from .urls import open_url_dir, reduce_public

__all__ = ["NodeCopy", "RemoteStore", "open_url", "version_source"]

#: Downloads of a version that gc evicts each time before this process holds it.
_EVICTED_ATTEMPTS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCopy:
    """The location of a store read from a URL through this node's cache."""

    url: str
    """The store's URL."""
    local: str
    """Its version directory in the node cache."""
    cache_dir: str | None = None
    """The cache directory (None: the default one)."""
    storage_options: dict[str, Any] | None = None
    """Options of the fsspec filesystem."""
    trust: Trust
    """The rules of the cache directory."""
    max_bytes: int | None = None
    """This process's cap of the node cache."""

    @property
    def shown(self) -> str:
        """The version directory in the node cache."""
        return self.local

    def __reduce__(self) -> tuple[Any, ...]:
        return reduce_public(self)  # no credential in a pickle

    def open(self) -> CacheStore:
        """Open this node's copy if it still holds the version, else the URL again."""
        if os.path.isfile(os.path.join(self.local, GROUP)):
            base = open_url_dir(self.url, self.cache_dir, self.trust)
            try:
                return _open_copy(self, base)
            except StoreNotFoundError:
                pass  # evicted meanwhile: fetch it again
            finally:
                os.close(base)
        return open_url(self.url, cache_dir=self.cache_dir, storage_options=self.storage_options,
                        trust=self.trust, max_bytes=self.max_bytes)


def open_url(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any] | None,
    trust: Trust,
    max_bytes: int | None = None,
) -> CacheStore:
    """Open the store at ``url`` through the node cache, fetching its metadata and index first.

    Raises
    ------
    StoreNotFoundError
        If there is no store at ``url``.
    CorruptStoreError
        If its files do not match their recorded sizes and checksums.
    UntrustedCacheError
        If the node copy, or a directory above it, fails ``trust``.
    """
    cache = None if cache_dir is None else os.fspath(cache_dir)
    options = None if storage_options is None else dict(storage_options)
    base = open_url_dir(url, cache, trust, create=True)
    try:
        for attempt in range(_EVICTED_ATTEMPTS):
            local = fetch_store(url, cache_dir=cache, storage_options=options, trust=trust,
                                url_dir_fd=base)
            where = NodeCopy(url=url, local=str(local), cache_dir=cache, storage_options=options,
                             trust=trust, max_bytes=max_bytes)
            try:
                return _open_copy(where, base)
            except StoreNotFoundError:
                # evicted from the node cache (gc) between its download and our hold on it
                if attempt == _EVICTED_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")
    finally:
        os.close(base)


def _open_copy(where: NodeCopy, base: int) -> CacheStore:
    """Hold the version, then let the reader map it (``base``: the URL's checked directory)."""
    local = Path(where.local)
    source = version_source(where.url, local, base, trust=where.trust,
                            storage_options=where.storage_options, max_bytes=where.max_bytes)
    try:
        return assemble(where, [source])  # closes the hold if it fails
    except FileNotFoundError:  # StoreNotFoundError too: evicted before we held it
        raise StoreNotFoundError(f"{local} was evicted from the node cache") from None


def version_source(
    url: str,
    local: Path,
    base: int,
    *,
    trust: Trust,
    storage_options: Mapping[str, Any] | None,
    max_bytes: int | None = None,
    hashes: Callable[[int], npt.NDArray[np.uint64] | None] | None = None,
) -> SegmentSource:
    """The segment of the version ``local`` of ``url`` in the node cache, held from now on.

    The hold is taken before the version is read (no evictor deletes a version
    a process holds) and released with the store; its shards are fetched when
    first read (:class:`~tensorstore_cache.remote.shards.NodeShards`).

    Parameters
    ----------
    url
        The store's URL.
    local
        Its version directory in the node cache.
    base
        The checked descriptor of the URL's directory in the node cache
        (open until the store is assembled).
    trust
        The rules of the cache directory.
    storage_options
        Options of the fsspec filesystem.
    max_bytes
        This process's cap of the node cache.
    hashes
        Reads the recorded content hashes of its sources (None: none kept).

    Raises
    ------
    StoreNotFoundError
        If the version is not in the node cache (evicted).
    """
    try:
        holds = RangeHolds(local.with_name(local.name + HOLDS_SUFFIX), trust)
    except FileNotFoundError:
        raise StoreNotFoundError(f"{local} was evicted from the node cache") from None
    options = None if storage_options is None else dict(storage_options)

    def supply(meta: GroupMetadata) -> NodeShards:
        return NodeShards(url, local, meta, holds=holds, storage_options=options,
                          max_bytes=max_bytes, trust=trust)

    return SegmentSource(root=local, trust=trust, parent_fd=base, supply=supply, hashes=hashes,
                         resources=[holds])


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteStore:
    """A store at a URL, not fetched yet: opening it fetches its current version's metadata
    and index into the node cache (the store then pickles as its :class:`NodeCopy`)."""

    url: str
    """The store's URL (``local://<path>`` for a store read through the node cache)."""
    cache_dir: str | None = None
    """The cache directory (None: the default one)."""
    storage_options: dict[str, Any] | None = None
    """Options of the fsspec filesystem."""
    trust: Trust
    """The rules of the cache directory."""
    max_bytes: int | None = None
    """This process's cap of the node cache."""

    @property
    def shown(self) -> str:
        """The URL."""
        return self.url

    def __reduce__(self) -> tuple[Any, ...]:
        return reduce_public(self)  # no credential in a pickle

    def open(self) -> CacheStore:
        """Fetch the current version's metadata and index (once per node), and open it."""
        return open_url(self.url, cache_dir=self.cache_dir, storage_options=self.storage_options,
                        trust=self.trust, max_bytes=self.max_bytes)
