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
    from .sources import resolve_identity, token_map
    from .staleness import stale_keys
    from .store import CacheStore, Location, view_of
    from .supply import FetchStats

#: Every name of the interface, by the module defining it.
_MODULES = {
    "assembly": ("MadeBy", "SegmentSource", "StoreDirectory", "assemble", "open_directory",),
    "record": ("Record",),
    "sources": ("resolve_identity", "token_map",),
    "staleness": ("stale_keys",),
    "store": ("CacheStore", "Location", "view_of",),
    "supply": ("FetchStats",),
}

__all__ = [
    "CacheStore",
    "FetchStats",
    "Location",
    "MadeBy",
    "Record",
    "SegmentSource",
    "StoreDirectory",
    "assemble",
    "open_directory",
    "resolve_identity",
    "stale_keys",
    "token_map",
    "view_of",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
