"""Opening store files safely and reading metadata strictly.

Every file of a store is opened through :func:`open_regular`: relative to the
store directory, one component at a time, never through a symlink, and only
if it is a regular file. Metadata is the only part of a store that is parsed;
:func:`read_json` reads it with a size cap, a nesting cap, no duplicate keys
and no ``NaN``/``Infinity`` constants, so a hostile ``zarr.json`` costs bounded
time and memory and never runs code. (Checks of a file's owner and mode
belong here too.)
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
from pathlib import Path
from typing import Any

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError

__all__ = ["map_file", "open_regular", "open_sized", "read_json"]


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


def _refusal(path: Path, part: str, dir_fd: int, exc: OSError, final: bool) -> CorruptStoreError:
    """Explain why ``part`` (a component of ``path``) could not be opened."""
    if exc.errno == errno.ENOENT:
        return CorruptStoreError(
            f"{path} is missing; the store is incomplete (run verify, then rebuild it)", str(path)
        )
    try:
        target = os.readlink(part, dir_fd=dir_fd)
    except OSError:
        return CorruptStoreError(f"{path} cannot be opened ({exc}); refusing it", str(path))
    where = "is a symlink" if final else f"is reached through a symlink ({part})"
    return CorruptStoreError(
        f"{path} {where} to {target!r}; a store never holds symlinks (they could lead "
        "outside it) - refusing it",
        str(path),
    )


def open_regular(path: Path, root: Path, root_fd: int | None = None) -> int:
    """Open a store file read-only and return its descriptor.

    The path below ``root`` is walked one component at a time with
    ``O_NOFOLLOW``: a symlink anywhere inside the store is refused (it could
    lead outside it), and so is anything that is not a regular file (a FIFO
    would block the reader, a device could be endless). ``root`` itself may
    be a symlink: that is the caller's choice.

    ``root_fd``, a descriptor of the store directory opened earlier, pins
    the directory: the file is looked up in the directory that was opened,
    even if another one has been renamed to ``root`` since (an overwrite).

    Raises
    ------
    CorruptStoreError
        If the file is missing or refused.
    """
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if os.path.isabs(rel) or ".." in parts or "." in parts:
        raise CorruptStoreError(f"{path} is not inside the store {root}; refusing it", str(path))
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        if root_fd is None:
            dir_fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        else:
            dir_fd = os.dup(root_fd)
    except OSError as exc:
        raise CorruptStoreError(f"{root} cannot be opened ({exc})", str(path)) from None
    try:
        for part in parts[:-1]:
            try:
                sub = os.open(part, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow,
                              dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(path, part, dir_fd, exc, False) from None
            os.close(dir_fd)
            dir_fd = sub
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | nofollow, dir_fd=dir_fd)
        except OSError as exc:
            raise _refusal(path, parts[-1], dir_fd, exc, True) from None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptStoreError(f"{path} is not a regular file; refusing it", str(path))
    return fd


def read_json(
    path: Path, *, max_bytes: int, root: Path | None = None, root_fd: int | None = None
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
        inside it (see :func:`open_regular`) and a missing file is a
        :class:`CorruptStoreError`.
    root_fd
        A descriptor of ``root`` to look the file up in (see :func:`open_regular`).

    Returns
    -------
    dict
        The decoded JSON object.

    Raises
    ------
    StoreNotFoundError
        If the file does not exist (and no ``root`` is given).
    CorruptStoreError
        If the file is too large, holds too many values, is too deeply
        nested, not UTF-8, not a JSON object, or contains duplicate keys or
        non-standard constants.
    """
    if root is not None:
        fd = open_regular(path, root, root_fd)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise StoreNotFoundError(f"{path} does not exist") from None
        except OSError as exc:
            raise CorruptStoreError(f"{path} cannot be opened ({exc}); refusing it", str(path)) from None
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


def map_file(
    path: Path, root: Path, expected_size: int, *, copy_on_write: bool, root_fd: int | None = None
) -> mmap.mmap | None:
    """Map a whole store file after checking its size; ``None`` for an empty file.

    ``root_fd`` (a descriptor of ``root``) pins the store directory, see
    :func:`open_regular`.

    Raises
    ------
    CorruptStoreError
        If the file is missing, not a regular file inside ``root``, or not
        exactly ``expected_size`` bytes (a truncated file would otherwise
        kill the reader with SIGBUS).
    """
    fd = open_sized(path, root, expected_size, root_fd)
    try:
        if expected_size == 0:
            return None
        access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
        return mmap.mmap(fd, expected_size, access=access)
    finally:
        os.close(fd)


def open_sized(path: Path, root: Path, expected_size: int, root_fd: int | None = None) -> int:
    """Open a store file with :func:`open_regular` and check its size; return the descriptor.

    The caller closes it. A file of another size than the store recorded is
    refused before anything maps it (mapping a truncated file and reading past
    its end would kill the reader with SIGBUS).

    Raises
    ------
    CorruptStoreError
        If the file is missing, not a regular file inside ``root``, or not
        exactly ``expected_size`` bytes.
    """
    fd = open_regular(path, root, root_fd)
    try:
        size = os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
    if size != expected_size:
        os.close(fd)
        raise CorruptStoreError(
            f"{path} is {size} bytes but the store recorded {expected_size}; the file "
            "was truncated or overwritten - rebuild the store",
            str(path),
        )
    return fd
