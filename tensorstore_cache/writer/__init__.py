"""Writing a store: shard tasks run by a process pool, assembly, atomic publication.

The layers above import only the names listed here (``from ..writer import X``),
never a module of this package; each is imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._interface import interface

if TYPE_CHECKING:
    from .builder import build, build_to_url, collect_debris
    from .merge import write_merged
    from .options import BuildOptions
    from .records import Schema, normalize_fields
    from .reentry import building

#: Every name of the interface, by the module defining it.
_MODULES = {
    "builder": ("build", "build_to_url", "collect_debris",),
    "merge": ("write_merged",),
    "options": ("BuildOptions",),
    "records": ("Schema", "normalize_fields",),
    "reentry": ("building",),
}

__all__ = [
    "BuildOptions",
    "Schema",
    "build",
    "build_to_url",
    "building",
    "collect_debris",
    "normalize_fields",
    "write_merged",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
