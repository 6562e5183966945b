"""Reading a store: mapped segments, their overlay, and the :class:`CacheStore` handle.

A location (a frozen, picklable value each layer that knows one defines) describes
its segments; :func:`assemble` alone builds the store.

The layers above import only the names listed here (``from ..reader import X``),
never a module of this package; each is imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._interface import interface

if TYPE_CHECKING:
    from .assembly import MadeBy, SegmentSource, StoreDirectory, assemble, open_directory
    from .record import Record
    from .sources import Identity, SourceIdentity, identify, resolve_identity, stale_mask, token_map
    from .store import CacheStore, Location, open_location
    from .supply import FetchStats, ShardSupply

#: Every name of the interface, by the module defining it.
_MODULES = {
    "assembly": ("MadeBy", "SegmentSource", "StoreDirectory", "assemble", "open_directory",),
    "record": ("Record",),
    "sources": ("Identity", "SourceIdentity", "identify", "resolve_identity", "stale_mask", "token_map",),
    "store": ("CacheStore", "Location", "open_location",),
    "supply": ("FetchStats", "ShardSupply",),
}

__all__ = [
    "CacheStore",
    "FetchStats",
    "Identity",
    "Location",
    "MadeBy",
    "Record",
    "SegmentSource",
    "ShardSupply",
    "SourceIdentity",
    "StoreDirectory",
    "assemble",
    "identify",
    "open_directory",
    "open_location",
    "resolve_identity",
    "stale_mask",
    "token_map",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
