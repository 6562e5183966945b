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
from typing import Any

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError, UntrustedCacheError
from .opens import StoreWalk, open_file, open_regular_stat
from .trust import Trust

__all__ = ["json_file_is", "parse_json_fd", "read_json"]

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


#: Maps ``{`` and ``}`` to ``[`` and ``]`` (:meth:`bytes.translate`): nesting is the same.
_SQUARE = bytes.maketrans(b"{}", b"[]")
#: Every byte but a bracket (deleted by :meth:`bytes.translate`).
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


def _depth(raw: bytes, value: Any) -> int:
    """Return the nesting depth of ``value``, decoded from the JSON document ``raw``, up to
    ``config.MAX_DEPTH + 1``.

    Without a backslash, the document's strings are every other piece between its
    quotes: the rest, brackets alone, loses its innermost level (the empty pairs, all at
    once) at every pass, and the passes are the depth. No Python object per value, and
    never more passes than the cap. A document with a backslash (an escaped quote could
    hide a string's end) is walked value by value instead.
    """
    if b"\\" in raw:
        return _depth_of_value(value)
    brackets = b"".join(raw.split(b'"')[::2]).translate(_SQUARE, _NOT_BRACKET)
    deepest = 0
    while brackets and deepest <= config.MAX_DEPTH:
        brackets = brackets.replace(b"[]", b"")
        deepest += 1
    return deepest


def _depth_of_value(value: Any) -> int:
    """Return the nesting depth of a decoded JSON value (iteratively), up to
    ``config.MAX_DEPTH + 1``."""
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


def _open_json(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str] | None,
    root_fd: int | StoreWalk | None,
    trust: Trust | None,
) -> tuple[int, os.stat_result | None]:
    """Open a metadata file (a store file below ``root``, or a path) for :func:`read_json`;
    its descriptor and, for a store file, its ``fstat``."""
    if root is not None:
        return open_regular_stat(path, root, root_fd, trust=trust)
    try:
        return open_file(path, trust if trust is not None else _UNCHECKED), None
    except FileNotFoundError:
        raise StoreNotFoundError(f"{path} does not exist") from None
    except UntrustedCacheError:  # a PermissionError, explained
        raise
    except OSError as exc:
        raise CorruptStoreError(f"{path} cannot be opened ({exc}); refusing it", str(path)) from None


def read_json(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    root: str | os.PathLike[str] | None = None,
    root_fd: int | StoreWalk | None = None,
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
    fd, st = _open_json(path, root, root_fd, trust)
    return _decode_strictly(_read_bounded(fd, st, path, max_bytes), path)


def json_file_is(
    path: str | os.PathLike[str],
    expected: dict[str, Any],
    *,
    max_bytes: int,
    root: str | os.PathLike[str],
    root_fd: int | StoreWalk | None = None,
    trust: Trust | None = None,
    seen: dict[bytes, Any] | None = None,
) -> bool:
    """Whether the metadata file ``path`` holds the document ``expected`` (compared as
    parsed JSON): what a store's allowlisted metadata files are checked with.

    A file holding it (the common case) is decoded once, by the C decoder alone,
    after the checks of :func:`read_json` that come before decoding (a regular
    file inside ``root``, ``trust``, the size cap); any other file is decoded
    strictly, as :func:`read_json` does, and raises what it raises.

    Parameters
    ----------
    path
        The JSON file, below ``root``.
    expected
        The only document it may hold.
    max_bytes, root, root_fd, trust
        As :func:`read_json`'s.
    seen
        The documents decoded by earlier calls, by their bytes: a file holding the same
        bytes as one of them is not decoded again (a store's arrays of one shape and type
        have the same document).

    Raises
    ------
    UntrustedCacheError, CorruptStoreError
        As :func:`read_json`.
    """
    fd, st = _open_json(path, root, root_fd, trust)
    raw = _read_bounded(fd, st, path, max_bytes)
    if seen is not None and raw in seen:
        return bool(seen[raw] == expected)
    try:
        value = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError too: said by the strict decoder
        return _decode_strictly(raw, path) == expected
    if value != expected:
        return _decode_strictly(raw, path) == expected
    if seen is not None:
        seen[raw] = value
    return True


def _read_bounded(
    fd: int, st: os.stat_result | None, path: str | os.PathLike[str], max_bytes: int
) -> bytes:
    """The bytes of the regular file open at ``fd`` (closed afterwards), at most ``max_bytes``;
    ``st``: its ``fstat`` if the caller has it."""
    try:
        if st is None:
            st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptStoreError(f"{path} is not a regular file, expected a JSON file", str(path))
        size = st.st_size
        if size > max_bytes:
            raise CorruptStoreError(
                f"{path} is {size} bytes, more than the {max_bytes} allowed for "
                "this metadata file; the store is damaged or not a tensorstore_cache store",
                str(path),
            )
        # one more byte than its size: a file that grew is seen (read allocates what it is
        # asked for, not max_bytes); a regular file reads short only at its end
        raw = os.read(fd, size + 1)
        if len(raw) not in (0, size, size + 1):  # a short read: read on up to its end
            parts = [raw]
            while (part := os.read(fd, size + 1 - sum(map(len, parts)))):
                parts.append(part)
            raw = b"".join(parts)
    finally:
        os.close(fd)
    if len(raw) != size:
        raise CorruptStoreError(f"{path} changed size while being read", str(path))
    return raw


def parse_json_fd(fd: int, path: str | os.PathLike[str], *, max_bytes: int) -> dict[str, Any]:
    """Read and decode the metadata file open at ``fd`` (closed afterwards), strictly.

    The bounded reader of :func:`read_json`, for a descriptor its caller
    opened and checked (``path`` names it in errors).

    Raises
    ------
    CorruptStoreError
        As :func:`read_json`.
    """
    return _decode_strictly(_read_bounded(fd, None, path, max_bytes), path)


def _decode_strictly(raw: bytes, path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of a metadata file's bytes, decoded strictly (see :func:`read_json`)."""
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
    try:
        value = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
        )
    except (ValueError, RecursionError) as exc:
        raise CorruptStoreError(f"{path} is not valid metadata JSON: {exc}", str(path)) from None
    if _depth(raw, value) > config.MAX_DEPTH:
        raise CorruptStoreError(
            f"{path} nests JSON deeper than {config.MAX_DEPTH} levels; refusing it", str(path)
        )
    if not isinstance(value, dict):
        raise CorruptStoreError(f"{path} must hold a JSON object", str(path))
    return value
