"""Strict, bounded reading and durable writing of the JSON metadata files.

Metadata is the only part of a store that is parsed. It is read with a size
cap, a nesting cap, no duplicate keys and no ``NaN``/``Infinity`` constants,
so a hostile ``zarr.json`` costs bounded time and memory and never runs code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ._errors import CorruptStoreError, StoreNotFoundError

__all__ = ["MAX_DEPTH", "fsync_dir", "read_json", "write_bytes_durable", "write_json_durable"]

#: Deepest nesting accepted in a metadata file.
MAX_DEPTH = 32


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _depth(value: Any) -> int:
    """Return the nesting depth of a decoded JSON value (iteratively)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def read_json(path: Path, *, max_bytes: int) -> dict[str, Any]:
    """Read a metadata file strictly.

    Parameters
    ----------
    path
        The JSON file.
    max_bytes
        Largest accepted file size; larger files are rejected before reading.

    Returns
    -------
    dict
        The decoded JSON object.

    Raises
    ------
    StoreNotFoundError
        If the file does not exist.
    CorruptStoreError
        If the file is too large, too deeply nested, not UTF-8, not a JSON
        object, or contains duplicate keys or non-standard constants.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise CorruptStoreError(
                    f"{path} is {size} bytes, more than the {max_bytes} allowed for "
                    "this metadata file; the store is damaged or not a tensorstore_cache store",
                    str(path),
                )
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise StoreNotFoundError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise CorruptStoreError(f"{path} is a directory, expected a JSON file", str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptStoreError(f"{path} is not UTF-8 text: {exc}", str(path)) from None
    try:
        value = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
        )
    except (ValueError, RecursionError) as exc:
        raise CorruptStoreError(f"{path} is not valid metadata JSON: {exc}", str(path)) from None
    if _depth(value) > MAX_DEPTH:
        raise CorruptStoreError(
            f"{path} nests JSON deeper than {MAX_DEPTH} levels; refusing it", str(path)
        )
    if not isinstance(value, dict):
        raise CorruptStoreError(f"{path} must hold a JSON object", str(path))
    return value


def fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_durable(path: Path, data: bytes | memoryview) -> None:
    """Create ``path`` with ``data`` and fsync it. The file must not exist yet."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_durable(path: Path, value: dict[str, Any]) -> None:
    """Create ``path`` holding ``value`` as indented JSON, fsynced."""
    write_bytes_durable(path, (json.dumps(value, indent=2, allow_nan=False) + "\n").encode())
