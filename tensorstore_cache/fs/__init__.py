"""Files: the layer every other one reads and writes the disk through.

The layers above import only the names listed here (``from ..fs import
open_dir``), never a module of this package. Each name is imported when it
is first used (PEP 562), so importing :mod:`tensorstore_cache` loads only
what it needs.

=====================  ==================================================================
module                 what it does
=====================  ==================================================================
``fs.trust``           trust policies (:class:`Trust`) and the one owner/mode check
``fs.opens``           the checked opens of cache entries and store files, and creation
``fs.jsonfile``        strict, bounded JSON of metadata files
``fs.durable``         durable writes: fsynced before published, atomic replacement
``fs.crash``           the crash-test hook (:func:`io_step`) marking every I/O step
``fs.locks``           locks that die with their holder, and the rule for no locks
``fs.ranges``          byte-range holds on one file (the node cache's shards)
``fs.temp``            the one temporary-name scheme, its sweepers, removing trees
``fs.sizes``           disk usage and ages, for housekeeping's reports
``fs.renames``         atomic exchange and no-replace renames (``renameat2``)
``fs.mounts``          which filesystem holds a path (network mounts)
``fs.sources``         a source file's identity: its stat and content hash, before a read
=====================  ==================================================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._interface import interface

if TYPE_CHECKING:
    from .crash import io_step
    from .durable import (
        file_digest,
        fsync_dir,
        fsync_tree,
        json_record,
        write_bytes_durable,
        write_json_durable,
        write_replace,
    )
    from .jsonfile import json_file_is, parse_json_fd, read_json
    from .locks import ExclusiveLock, Holder, SharedHold, is_held, read_holder, try_exclusive
    from .mounts import network_mount
    from .opens import (
        StoreWalk,
        create_file,
        make_dir,
        map_file,
        open_dir,
        open_file,
        open_regular,
        open_root,
        open_sized,
    )
    from .ranges import RangeHolds, try_lock_range, unlock_range
    from .renames import exchange_dirs
    from .sizes import age_text, disk_usage
    from .sources import hash_many, identify, racy_since, stat_many
    from .temp import (
        TempName,
        collect_temps,
        delete_tree,
        discard_tree,
        parse_temp,
        remove_temps,
        remove_tree,
        temp_path,
    )
    from .trust import (
        EXPLICIT,
        Trust,
        apply_modes,
        describe_owner,
        resolve_trust,
        user_name,
    )

#: Every name of the interface, and the module defining it.
_MODULES = {
    "crash": ("io_step",),
    "durable": (
        "file_digest", "fsync_dir", "fsync_tree", "json_record", "write_bytes_durable",
        "write_json_durable", "write_replace",
    ),
    "jsonfile": ("json_file_is", "parse_json_fd", "read_json"),
    "locks": ("ExclusiveLock", "Holder", "SharedHold", "is_held", "read_holder", "try_exclusive"),
    "mounts": ("network_mount",),
    "opens": (
        "StoreWalk", "create_file", "make_dir", "map_file", "open_dir", "open_file",
        "open_regular", "open_root", "open_sized",
    ),
    "ranges": ("RangeHolds", "try_lock_range", "unlock_range"),
    "renames": ("exchange_dirs",),
    "sources": ("hash_many", "identify", "racy_since", "stat_many"),
    "sizes": ("age_text", "disk_usage"),
    "temp": (
        "TempName", "collect_temps", "delete_tree", "discard_tree", "parse_temp", "remove_temps", "remove_tree",
        "temp_path",
    ),
    "trust": (
        "EXPLICIT", "Trust", "apply_modes", "describe_owner", "resolve_trust",
        "user_name",
    ),
}
__all__ = [
    "EXPLICIT",
    "ExclusiveLock",
    "Holder",
    "RangeHolds",
    "SharedHold",
    "StoreWalk",
    "TempName",
    "Trust",
    "age_text",
    "apply_modes",
    "collect_temps",
    "create_file",
    "delete_tree",
    "describe_owner",
    "discard_tree",
    "disk_usage",
    "exchange_dirs",
    "file_digest",
    "fsync_dir",
    "fsync_tree",
    "hash_many",
    "identify",
    "io_step",
    "is_held",
    "json_file_is",
    "json_record",
    "make_dir",
    "map_file",
    "network_mount",
    "open_dir",
    "open_file",
    "open_regular",
    "open_root",
    "open_sized",
    "parse_json_fd",
    "parse_temp",
    "racy_since",
    "read_holder",
    "read_json",
    "remove_temps",
    "remove_tree",
    "resolve_trust",
    "stat_many",
    "temp_path",
    "try_exclusive",
    "try_lock_range",
    "unlock_range",
    "user_name",
    "write_bytes_durable",
    "write_json_durable",
    "write_replace",
]


if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
