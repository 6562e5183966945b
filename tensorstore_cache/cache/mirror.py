"""Parts of a namespace kept in the node cache: a namespace's copy of a cluster's parts.

With ``remote=`` a node's namespace lists the parts of a remote generation,
but holds none of their files: each part is a store at the remote prefix,
opened through the node cache (``<cache_dir>/remote/``: its metadata and
index from its bundle, its shards fetched when first read, under the cache's
cap and eviction). The namespace keeps, instead of the part's directory, a
pointer ``parts/<id>.remote``::

    {"kind": "tensorstore_cache.node_part", "url": "<the part's URL>",
     "version": "<XXH3-128 of its group zarr.json>"}

written once, when the part is first opened on this node (or built here),
and never rewritten. Its sources' content hashes, if any, lie beside it as
for any part (``parts/<id>.source_xxh3``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CorruptStoreError, StoreNotFoundError
from ..fs import Trust, open_file, parse_json_fd, temp_path, write_json_durable
from ..reader import SegmentSource
from ..remote import node_dir, open_url_dir, version_source

__all__ = ["POINTER_SUFFIX", "node_copy", "node_part", "node_part_here", "pointer_path",
           "write_pointer"]

#: The pointer of a part kept in the node cache: ``parts/<id>`` + this.
POINTER_SUFFIX = ".remote"
_KIND = "tensorstore_cache.node_part"
_VERSION = re.compile(r"[0-9a-f]{32}")


def pointer_path(part_dir: Path) -> Path:
    """The pointer file of the part whose directory would be ``part_dir``."""
    return part_dir.with_name(part_dir.name + POINTER_SUFFIX)


def write_pointer(part_dir: Path, url: str, version: str, trust: Trust) -> None:
    """Record that the part of ``part_dir`` is version ``version`` of ``url`` in the node
    cache (atomically: a reader finds the whole pointer or none)."""
    final = pointer_path(part_dir)
    tmp = temp_path(final, "new")
    write_json_durable(tmp, {"kind": _KIND, "url": url, "version": version}, trust=trust)
    os.replace(tmp, final)


def _read_pointer(part_dir: Path, parts_fd: int, trust: Trust) -> tuple[str, str] | None:
    """``(url, version)`` of the part of ``part_dir`` kept in the node cache; None if it
    has no pointer."""
    path = pointer_path(part_dir)
    try:
        fd = open_file(path.name, trust, dir_fd=parts_fd, shown=path)
    except FileNotFoundError:
        return None
    doc = parse_json_fd(fd, path, max_bytes=64 << 10)
    url, version = doc.get("url"), doc.get("version")
    if doc.get("kind") != _KIND or not isinstance(url, str) or not isinstance(version, str) \
            or not _VERSION.fullmatch(version):
        raise CorruptStoreError(f"{path} is not the pointer of a part kept in the node cache; "
                                "the cache directory is damaged - remove this file", str(path))
    return url, version


def node_part(
    part_dir: Path,
    parts_fd: int,
    trust: Trust,
    *,
    storage_options: Mapping[str, Any] | None,
    hashes: Any = None,
) -> tuple[SegmentSource, int] | None:
    """The segment of the part of ``part_dir`` kept in the node cache, held, and the
    descriptor of its URL's directory (to close once the store is assembled); None if the
    part has no pointer.

    Raises
    ------
    StoreNotFoundError
        If its version is no longer in the node cache (evicted).
    """
    found = _read_pointer(part_dir, parts_fd, trust)
    if found is None:
        return None
    url, version = found
    cache_dir = part_dir.parent.parent.parent  # <cache_dir>/<namespace>/parts/<id>
    try:
        base = open_url_dir(url, cache_dir, trust)
    except FileNotFoundError:
        raise StoreNotFoundError(f"{url} is no longer in the node cache") from None
    local = node_dir(url, cache_dir) / version
    try:
        if not os.path.isdir(local):
            raise StoreNotFoundError(f"{local} was evicted from the node cache")
        source = version_source(url, local, base, trust=trust, storage_options=storage_options,
                                hashes=hashes)
    except BaseException:
        os.close(base)
        raise
    return source, base


def node_copy(part_dir: Path, trust: Trust) -> Path | None:
    """Where the node cache keeps the version the pointer of ``part_dir`` names (None: the
    part has no readable pointer); the directory may have been evicted."""
    path = pointer_path(part_dir)
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        found = _read_pointer(part_dir, fd, trust)
    except (OSError, CorruptStoreError):
        return None
    finally:
        os.close(fd)
    if found is None:
        return None
    url, version = found
    return node_dir(url, part_dir.parent.parent.parent) / version


def node_part_here(part_dir: Path, trust: Trust) -> bool:
    """Whether the part of ``part_dir`` is kept in the node cache and its version is there."""
    copy = node_copy(part_dir, trust)
    return copy is not None and copy.is_dir()
