"""Durable writes: data on disk before it is published.

A file is written, fsynced and only then renamed into place; a directory is
fsynced after entries are added to it. Inside a directory that is published
as a whole later (a build's), files may instead be written with
``sync=False``: their writing-back starts at once, and the directory is made
durable in one go before it is published (:func:`fsync_tree`), every file and
directory of it synced at the same time, which costs about one sync instead of
one per file. Every such step is marked with
:func:`~tensorstore_cache.fs.crash.io_step`, so that the crash tests can kill
a writer at each one in turn.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from .crash import io_step
from .opens import create_file
from .temp import temp_path
from .trust import EXPLICIT, Trust

__all__ = [
    "file_digest",
    "fsync_dir",
    "fsync_tree",
    "write_bytes_durable",
    "write_json_durable",
    "write_replace",
]

#: fsync errors meaning "directories cannot be synced here", not "the data is lost".
_FSYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EISDIR})


def fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk.

    A no-op where directories cannot be opened or synced (``EINVAL`` and the
    like); a real I/O error (``EIO``, ``ENOSPC``, ...) is raised, because it
    means earlier writes may be lost.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        io_step("fsync_dir")
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


#: ``sync_file_range(2)`` (Linux), once looked up: False where there is none.
_sync_file_range: Callable[[int, int, int, int], int] | bool | None = None
_SYNC_FILE_RANGE_WRITE = 2


def _write_back(fd: int) -> None:
    """Start writing ``fd``'s data to disk without waiting for it (where the system can: Linux's
    ``sync_file_range``; elsewhere the data goes when the system flushes it, or at the sync)."""
    global _sync_file_range
    if _sync_file_range is None:
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            _sync_file_range = fn
        except (OSError, AttributeError, ImportError):
            _sync_file_range = False
    if callable(_sync_file_range):
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # a hint: a failure shows at the sync


def _write_all(fd: int, parts: list[memoryview], sync: bool = True) -> tuple[int, str]:
    """Write ``parts`` to ``fd`` in order and fsync it (``sync``, else start its writing-back);
    return the size and XXH3-128 written."""
    digest = xxhash.xxh3_128()
    size = 0
    for part in parts:
        digest.update(part)
        size += len(part)
        while part:
            io_step("write")
            part = part[os.write(fd, part):]
    if sync:
        io_step("fsync")
        os.fsync(fd)
    else:
        _write_back(fd)
    return size, digest.hexdigest()


def write_bytes_durable(
    path: Path, data: bytes | memoryview, *, trust: Trust | None = None, sync: bool = True
) -> tuple[int, str]:
    """Create ``path`` with ``data`` and fsync it (``sync=False``: :func:`fsync_tree` will);
    return its size and XXH3-128.

    The file must not exist yet. It gets the file mode of ``trust`` (default:
    ``0o644`` through the umask).
    """
    io_step("create")
    fd = create_file(path, trust or EXPLICIT)
    try:
        return _write_all(fd, [memoryview(data)], sync)
    finally:
        os.close(fd)


def json_bytes(value: dict[str, Any]) -> bytes:
    """``value`` as a metadata file holds it: indented JSON and a newline, UTF-8."""
    return (json.dumps(value, indent=2, allow_nan=False) + "\n").encode()


def json_record(value: dict[str, Any]) -> tuple[int, str]:
    """The size and XXH3-128 of the metadata file :func:`write_json_durable` writes of
    ``value``."""
    data = json_bytes(value)
    return len(data), xxhash.xxh3_128_hexdigest(data)


def write_json_durable(
    path: Path, value: dict[str, Any], *, trust: Trust | None = None, sync: bool = True
) -> tuple[int, str]:
    """Create ``path`` holding ``value`` as indented JSON (:func:`json_bytes`), fsynced
    (``sync=False``: :func:`fsync_tree` will; modes of ``trust``).

    Returns its size and XXH3-128.
    """
    return write_bytes_durable(path, json_bytes(value), trust=trust, sync=sync)


#: Threads that sync the entries of a tree at the same time.
TREE_SYNC_THREADS = 16


def _fsync_path(path: str, directory: bool) -> None:
    if directory:
        fsync_dir(Path(path))
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        io_step("fsync")
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` (``root`` included) to disk, all at once.

    What a build wrote with ``sync=False`` is durable once this returns. The syncs
    run side by side in :data:`TREE_SYNC_THREADS` threads, so that the file system
    commits them together rather than one after another. Symbolic links are not
    followed.

    Raises
    ------
    OSError
        The first error of a sync (``EIO``, ``ENOSPC``...): what was written may be lost.
    """
    entries = []
    for dirpath, _dirs, names in os.walk(root):
        entries += [(os.path.join(dirpath, n), False) for n in names
                    if not os.path.islink(os.path.join(dirpath, n))]
        entries.append((dirpath, True))
    if len(entries) <= 2:
        for path, directory in entries:
            _fsync_path(path, directory)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(TREE_SYNC_THREADS, len(entries)),
                            thread_name_prefix="tsc-sync") as pool:
        for future in [pool.submit(_fsync_path, p, d) for p, d in entries]:
            future.result()


def write_replace(
    path: Path, parts: list[memoryview], *, trust: Trust | None = None, sync: bool = True
) -> tuple[int, str]:
    """Write ``parts`` to ``path`` durably (``sync=False``: :func:`fsync_tree` will) and
    atomically; return its size and XXH3-128.

    The bytes go to a temporary sibling first (``.<name>.tsc-new-...``, see
    :func:`~tensorstore_cache.fs.temp.temp_path`), fsynced, which then replaces
    ``path`` with one ``os.replace``: a reader never finds a half-written file
    at ``path``, and a writer killed part-way leaves only that temporary file
    behind. Writing the same file twice is safe; the last
    complete write wins. The parent directory must exist. The file gets the
    file mode of ``trust`` (default: ``0o644`` through the umask).
    """
    partial = temp_path(path, "new")
    io_step("create")
    fd = create_file(partial, trust or EXPLICIT)
    try:
        try:
            entry = _write_all(fd, parts, sync)
        finally:
            os.close(fd)
        io_step("rename")
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return entry


def file_digest(file: int | Path, buf: bytearray | None = None) -> tuple[int, str]:
    """Return ``(bytes read, XXH3-128 hex)`` of a file: an open descriptor (read from
    its start, left open) or a path.

    The one checksum of whole files: recorded by builds, checked by
    ``verify`` and by downloads.
    """
    if not isinstance(file, int):
        fd = os.open(file, os.O_RDONLY)
        try:
            return file_digest(fd, buf)
        finally:
            os.close(fd)
    fd = file
    digest = xxhash.xxh3_128()
    buf = buf if buf is not None else bytearray(8 << 20)
    view = memoryview(buf)
    size = 0
    offset = 0
    while n := os.preadv(fd, [buf], offset):
        digest.update(view[:n])
        size += n
        offset += n
    return size, digest.hexdigest()
