"""Writing a store: shard tasks run by a process pool, assembly, atomic publication.

The layers above import only the names listed here (``from ..writer import X``),
never a module of this package; each is imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._interface import interface

if TYPE_CHECKING:
    from .assemble import finish_store, publish, rewrite_rows
    from .builder import (
        build,
        build_to_url,
        collect_debris,
        default_workers,
        rows_per_shard,
        temp_dir,
    )
    from .fields import record_spec
    from .options import BuildOptions
    from .ragged import RaggedWriter
    from .records import Schema, check_record, infer_schema, is_record, normalize_fields
    from .reentry import building

#: Every name of the interface, by the module defining it.
_MODULES = {
    "assemble": ("finish_store", "publish", "rewrite_rows",),
    "builder": ("build", "build_to_url", "collect_debris", "default_workers", "rows_per_shard", "temp_dir",),
    "fields": ("record_spec",),
    "options": ("BuildOptions",),
    "ragged": ("RaggedWriter",),
    "records": ("Schema", "check_record", "infer_schema", "is_record", "normalize_fields",),
    "reentry": ("building",),
}

__all__ = [
    "BuildOptions",
    "RaggedWriter",
    "Schema",
    "build",
    "build_to_url",
    "building",
    "check_record",
    "collect_debris",
    "default_workers",
    "finish_store",
    "infer_schema",
    "is_record",
    "normalize_fields",
    "publish",
    "record_spec",
    "rewrite_rows",
    "rows_per_shard",
    "temp_dir",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
