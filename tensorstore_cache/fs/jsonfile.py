"""Strict JSON: metadata read with bounded time and memory, never running code.

Metadata is the only part of a store that is parsed. :func:`read_json` reads
it with a size cap, a cap on the number of values, a nesting cap, no
duplicate keys and no ``NaN``/``Infinity`` constants, so a hostile
``zarr.json`` costs bounded time and memory and never runs code. The file is
opened through :mod:`~tensorstore_cache.fs.opens` (checked against the
caller's :class:`~tensorstore_cache.fs.trust.Trust`).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError, UntrustedCacheError
from .opens import open_file, open_regular
from .trust import Trust

__all__ = ["parse_json_fd", "read_json"]

#: Reading a metadata file named by its path alone, when the caller gives no policy.
_UNCHECKED = Trust.explicit(warn=False)


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
        if deepest > config.MAX_DEPTH:
            break
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def read_json(
    path: Path,
    *,
    max_bytes: int,
    root: Path | None = None,
    root_fd: int | None = None,
    trust: Trust | None = None,
) -> dict[str, Any]:
    """Read a metadata file strictly.

    Parameters
    ----------
    path
        The JSON file.
    max_bytes
        Largest accepted file size; larger files are rejected before reading.
    root
        The store directory: when given, ``path`` must be a regular file
        inside it (see :func:`~tensorstore_cache.fs.opens.open_regular`)
        and a missing file is a :class:`CorruptStoreError`.
    root_fd
        A descriptor of ``root`` to look the file up in.
    trust
        Checked on every descriptor opened (below ``root``, or the file);
        default: nothing is checked when no ``root`` is given.

    Returns
    -------
    dict
        The decoded JSON object.

    Raises
    ------
    StoreNotFoundError
        If the file does not exist (and no ``root`` is given).
    UntrustedCacheError
        If a directory or the file fails ``trust``.
    CorruptStoreError
        If the file is not a regular file, is too large, holds too many values, is too deeply
        nested, not UTF-8, not a JSON object, or contains duplicate keys or
        non-standard constants.
    """
    if root is not None:
        fd = open_regular(path, root, root_fd, trust=trust)
    else:
        try:
            fd = open_file(path, trust if trust is not None else _UNCHECKED)
        except FileNotFoundError:
            raise StoreNotFoundError(f"{path} does not exist") from None
        except UntrustedCacheError:  # a PermissionError, explained
            raise
        except OSError as exc:
            raise CorruptStoreError(f"{path} cannot be opened ({exc}); refusing it", str(path)) from None
    return parse_json_fd(fd, path, max_bytes=max_bytes)


def parse_json_fd(fd: int, path: str | os.PathLike[str], *, max_bytes: int) -> dict[str, Any]:
    """Read and decode the metadata file open at ``fd`` (closed afterwards), strictly.

    The bounded reader of :func:`read_json`, for a descriptor its caller
    opened and checked (``path`` names it in errors).

    Raises
    ------
    CorruptStoreError
        As :func:`read_json`.
    """
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptStoreError(f"{path} is not a regular file, expected a JSON file", str(path))
        if st.st_size > max_bytes:
            raise CorruptStoreError(
                f"{path} is {st.st_size} bytes, more than the {max_bytes} allowed for "
                "this metadata file; the store is damaged or not a tensorstore_cache store",
                str(path),
            )
        raw = f.read(st.st_size + 1)  # not max_bytes: read() allocates what it is asked for
    if len(raw) != st.st_size:
        raise CorruptStoreError(f"{path} changed size while being read", str(path))
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if values > config.MAX_VALUES:
        raise CorruptStoreError(
            f"{path} holds about {values} JSON values, more than the {config.MAX_VALUES} allowed; "
            "refusing it",
            str(path),
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptStoreError(f"{path} is not UTF-8 text: {exc}", str(path)) from None
    del raw
    try:
        value = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
        )
    except (ValueError, RecursionError) as exc:
        raise CorruptStoreError(f"{path} is not valid metadata JSON: {exc}", str(path)) from None
    if _depth(value) > config.MAX_DEPTH:
        raise CorruptStoreError(
            f"{path} nests JSON deeper than {config.MAX_DEPTH} levels; refusing it", str(path)
        )
    if not isinstance(value, dict):
        raise CorruptStoreError(f"{path} must hold a JSON object", str(path))
    return value
