"""Opening store files safely and reading metadata strictly.

Every file of a store is opened through :func:`open_regular`: relative to the
store directory, one component at a time, never through a symlink, and only
if it is a regular file. Metadata is the only part of a store that is parsed;
:func:`read_json` reads it with a size cap, a nesting cap, no duplicate keys
and no ``NaN``/``Infinity`` constants, so a hostile ``zarr.json`` costs bounded
time and memory and never runs code. Every directory and file opened is
checked against the caller's :class:`~tensorstore_cache.fs.trust.Trust` (its
owner and mode, on the descriptor opened).
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
from .trust import Trust, check_fd, check_stat, passes

__all__ = ["map_file", "open_regular", "open_sized", "parse_json_fd", "read_json"]

_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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


def _refusal(
    path: Path, shown: Path, part: str, dir_fd: int, exc: OSError, final: bool, trust: Trust
) -> CorruptStoreError:
    """Explain why ``part`` (a component of ``path``, at ``shown``) could not be opened.

    Raises
    ------
    UntrustedCacheError
        If the open was refused because of the entry's owner or mode.
    """
    if exc.errno == errno.ENOENT:
        return CorruptStoreError(
            f"{path} is missing; the store is incomplete (run verify, then rebuild it)", str(path)
        )
    if isinstance(exc, PermissionError):  # the owner and mode of the entry may say why
        try:
            st = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None:
            check_stat(st, shown, trust)
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


def open_regular(
    path: Path, root: Path, root_fd: int | None = None, *, trust: Trust | None = None
) -> int:
    """Open a store file read-only and return its descriptor.

    The path below ``root`` is walked one component at a time with
    ``O_NOFOLLOW``: a symlink anywhere inside the store is refused (it could
    lead outside it), and so is anything that is not a regular file (a FIFO
    would block the reader, a device could be endless). ``root`` itself may
    be a symlink: that is the caller's choice.

    ``root_fd``, a descriptor of the store directory opened earlier, pins
    the directory: the file is looked up in the directory that was opened,
    even if another one has been renamed to ``root`` since (an overwrite).

    ``trust`` is checked on every descriptor opened: ``root`` (unless
    ``root_fd`` is given: its opener checked it), each directory below it and
    the file. Default: the path's owner is not checked, but the first
    directory or file others can write gets a warning (``Trust.explicit``).

    Raises
    ------
    CorruptStoreError
        If the file is missing or refused.
    UntrustedCacheError
        If a directory or the file fails ``trust``.
    """
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if os.path.isabs(rel) or ".." in parts or "." in parts:
        raise CorruptStoreError(f"{path} is not inside the store {root}; refusing it", str(path))
    if trust is None:
        trust = Trust.explicit(root)
    try:
        dir_fd = os.open(root, _O_DIR) if root_fd is None else os.dup(root_fd)
    except OSError as exc:
        raise CorruptStoreError(f"{root} cannot be opened ({exc})", str(path)) from None
    try:
        if root_fd is None:
            check_fd(dir_fd, root, trust)
        for i, part in enumerate(parts[:-1]):
            try:
                sub = os.open(part, _O_DIR | _NOFOLLOW, dir_fd=dir_fd)
            except OSError as exc:
                below = root.joinpath(*parts[: i + 1])
                raise _refusal(path, below, part, dir_fd, exc, False, trust) from None
            os.close(dir_fd)
            dir_fd = sub
            if not passes(os.fstat(dir_fd), trust):  # the path is built only when needed
                check_fd(dir_fd, root.joinpath(*parts[: i + 1]), trust)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            raise _refusal(path, path, parts[-1], dir_fd, exc, True, trust) from None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptStoreError(f"{path} is not a regular file; refusing it", str(path))
        check_stat(st, path, trust)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        inside it (see :func:`open_regular`) and a missing file is a
        :class:`CorruptStoreError`.
    root_fd
        A descriptor of ``root`` to look the file up in (see :func:`open_regular`).
    trust
        Checked on every descriptor opened below ``root`` (see :func:`open_regular`).

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
        fd = open_regular(path, root, root_fd, trust=trust)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
        except FileNotFoundError:
            raise StoreNotFoundError(f"{path} does not exist") from None
        except OSError as exc:
            raise CorruptStoreError(f"{path} cannot be opened ({exc}); refusing it", str(path)) from None
        if trust is not None:
            try:
                check_fd(fd, path, trust)
            except BaseException:
                os.close(fd)
                raise
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


def map_file(
    path: Path,
    root: Path,
    expected_size: int,
    *,
    copy_on_write: bool,
    root_fd: int | None = None,
    trust: Trust | None = None,
) -> mmap.mmap | None:
    """Map a whole store file after checking its size; ``None`` for an empty file.

    ``root_fd`` (a descriptor of ``root``) pins the store directory, and
    ``trust`` is checked on every descriptor opened; see :func:`open_regular`.

    Raises
    ------
    CorruptStoreError
        If the file is missing, not a regular file inside ``root``, or not
        exactly ``expected_size`` bytes (a truncated file would otherwise
        kill the reader with SIGBUS).
    """
    fd = open_sized(path, root, expected_size, root_fd, trust=trust)
    try:
        if expected_size == 0:
            return None
        access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
        return mmap.mmap(fd, expected_size, access=access)
    finally:
        os.close(fd)


def open_sized(
    path: Path,
    root: Path,
    expected_size: int,
    root_fd: int | None = None,
    *,
    trust: Trust | None = None,
) -> int:
    """Open a store file with :func:`open_regular` and check its size; return the descriptor.

    The caller closes it. A file of another size than the store recorded is
    refused before anything maps it (mapping a truncated file and reading past
    its end would kill the reader with SIGBUS). ``trust`` is checked on every
    descriptor opened (see :func:`open_regular`).

    Raises
    ------
    CorruptStoreError
        If the file is missing, not a regular file inside ``root``, or not
        exactly ``expected_size`` bytes.
    """
    fd = open_regular(path, root, root_fd, trust=trust)
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
