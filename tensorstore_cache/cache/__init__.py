"""The cache directory: namespaces of immutable parts, get-or-build, compaction, housekeeping.

The layers above import only the names listed here (``from ..cache import X``),
never a module of this package; each is imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._interface import interface

if TYPE_CHECKING:
    from .cached import CacheOptions, cached_store
    from .cluster import RemoteOptions
    from .housekeeping import Removed, gc
    from .listing import CacheInfo, list_caches
    from .namespace import NamespaceDirectory, is_namespace
    from .remote_tools import RemoteCacheInfo

#: Every name of the interface, by the module defining it.
_MODULES = {
    "cached": ("CacheOptions", "cached_store"),
    "cluster": ("RemoteOptions",),
    "housekeeping": ("Removed", "gc"),
    "listing": ("CacheInfo", "list_caches"),
    "namespace": ("NamespaceDirectory", "is_namespace"),
    "remote_tools": ("RemoteCacheInfo",),
}

__all__ = [
    "CacheInfo",
    "CacheOptions",
    "NamespaceDirectory",
    "RemoteCacheInfo",
    "RemoteOptions",
    "Removed",
    "cached_store",
    "gc",
    "is_namespace",
    "list_caches",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
