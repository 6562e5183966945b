"""Durable writes: data on disk before it is published, and the crash-test hook.

A file is written, fsynced and only then renamed into place; a directory is
fsynced after entries are added to it. :func:`io_step` marks every such step
so that the crash tests can kill a writer at each one in turn.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import xxhash

__all__ = [
    "PARTIAL_SUFFIX",
    "exchange_dirs",
    "file_digest",
    "fsync_dir",
    "fsync_dirs",
    "io_step",
    "remove_partials",
    "write_bytes_durable",
    "write_json_durable",
    "write_replace",
]

#: Suffix of a file being written by :func:`write_replace` (``<name>.<uuid>.partial``).
PARTIAL_SUFFIX = ".partial"

# Crash-test hook: with TSC_TEST_KILL_AT=k in the environment, the k-th build I/O
# step of this process (each mkdir, write, fsync, rename) SIGKILLs it just before
# the step runs; k=-1 only counts the steps (in ``_io_trace``). Unset: one global test.
_KILL_AT = int(os.environ.get("TSC_TEST_KILL_AT") or 0)
_io_trace: list[str] = []


def io_step(what: str) -> None:
    """Mark one build I/O step (a no-op unless the crash-test hook is armed)."""
    if _KILL_AT:
        _io_trace.append(what)
        if len(_io_trace) == _KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)


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


_RENAME_EXCHANGE = 2
_renameat2: Any = None
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int
except (OSError, AttributeError):  # not Linux, or a C library without renameat2
    _renameat2 = None


def exchange_dirs(a: Path, b: Path) -> bool:
    """Atomically swap two directory entries (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns
    -------
    bool
        ``True`` if swapped; ``False`` where the system or file system cannot
        (the caller then falls back to two renames). Other errors are raised.
    """
    if _renameat2 is None:
        return False
    at_fdcwd = -100
    if _renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def write_bytes_durable(path: Path, data: bytes | memoryview) -> None:
    """Create ``path`` with ``data`` and fsync it. The file must not exist yet."""
    io_step("create")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            io_step("write")
            written = os.write(fd, view)
            view = view[written:]
        io_step("fsync")
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_durable(path: Path, value: dict[str, Any]) -> None:
    """Create ``path`` holding ``value`` as indented JSON, fsynced."""
    write_bytes_durable(path, (json.dumps(value, indent=2, allow_nan=False) + "\n").encode())


def fsync_dirs(leaf: Path, top: Path) -> None:
    """Fsync ``leaf`` and every directory above it up to and including ``top``."""
    d = leaf
    while True:
        fsync_dir(d)
        if d == top or d == d.parent:
            return
        d = d.parent


def write_replace(path: Path, parts: list[memoryview]) -> tuple[int, str]:
    """Write ``parts`` to ``path`` durably and atomically; return its size and XXH3-128.

    The bytes go to ``<path>.<uuid>.partial`` first, fsynced, which then
    replaces ``path`` with one ``os.replace``: a reader never finds a
    half-written file at ``path``, and a writer killed part-way leaves only a
    ``.partial`` file behind. Writing the same file twice is safe; the last
    complete write wins. The parent directory must exist.
    """
    digest = xxhash.xxh3_128()
    size = 0
    partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    io_step("create")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            for part in parts:
                digest.update(part)
                size += len(part)
                while part:
                    io_step("write")
                    part = part[os.write(fd, part):]
            io_step("fsync")
            os.fsync(fd)
        finally:
            os.close(fd)
        io_step("rename")
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return size, digest.hexdigest()


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


def remove_partials(root: Path) -> int:
    """Delete every ``*.partial`` file under ``root`` (left by killed writers); return the count."""
    count = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name.endswith(PARTIAL_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))
                    count += 1
    return count
