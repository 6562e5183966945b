"""Strict, bounded reading and durable writing of the JSON metadata files.

Metadata is the only part of a store that is parsed. It is read with a size
cap, a nesting cap, no duplicate keys and no ``NaN``/``Infinity`` constants,
so a hostile ``zarr.json`` costs bounded time and memory and never runs code.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

from ..errors import CorruptStoreError, StoreNotFoundError

__all__ = [
    "MAX_DEPTH",
    "MAX_VALUES",
    "exchange_dirs",
    "fsync_dir",
    "io_step",
    "open_regular",
    "read_json",
    "write_bytes_durable",
    "write_json_durable",
]

#: Deepest nesting accepted in a metadata file.
MAX_DEPTH = 32
#: Most JSON values (roughly: commas and brackets) accepted in a metadata file,
#: counted before decoding so that a small file cannot expand into gigabytes of objects.
MAX_VALUES = 2_000_000

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
    if values > MAX_VALUES:
        raise CorruptStoreError(
            f"{path} holds about {values} JSON values, more than the {MAX_VALUES} allowed; "
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
    if _depth(value) > MAX_DEPTH:
        raise CorruptStoreError(
            f"{path} nests JSON deeper than {MAX_DEPTH} levels; refusing it", str(path)
        )
    if not isinstance(value, dict):
        raise CorruptStoreError(f"{path} must hold a JSON object", str(path))
    return value


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
