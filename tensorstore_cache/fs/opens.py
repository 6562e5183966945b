"""Checked opens: every directory and file the package reads or creates is opened one way.

Every open here

* never follows a symlink below the directory it starts from
  (``O_NOFOLLOW``; only a root the user names may be reached through one);
* opens files with ``O_NONBLOCK`` and accepts only regular files (a FIFO
  would block the reader, a device could be endless);
* checks the descriptor actually opened against a
  :class:`~tensorstore_cache.fs.trust.Trust` (owner and mode, by ``fstat``);
* explains a refusal by the system (``PermissionError``) by the entry's
  owner and mode when they are the cause (an ``lstat`` for the message only:
  nothing else is opened or read).

What is opened is named one of two ways:

cache entries (:func:`open_root`, :func:`open_dir`, :func:`open_file`, :func:`create_file`, :func:`make_dir`)
    one name relative to a directory descriptor opened and checked before
    (or a path); the system's errors (``FileNotFoundError``, ...) reach the
    caller.
store files (:func:`open_regular`, :func:`open_sized`, :func:`map_file`)
    a path below a store directory, walked one component at a time; a file
    missing, reached through a symlink or not regular is a
    :class:`~tensorstore_cache.errors.CorruptStoreError` naming it.

What is created gets the policy's modes. In a shared cache, a directory (and
a file every member opens by name) is prepared under a temporary name
(:func:`~tensorstore_cache.fs.temp.temp_path`) and put in place without
replacing anything, so another member never finds it half made.
:func:`make_dir` marks its steps for the crash tests
(:func:`~tensorstore_cache.fs.crash.io_step`).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from pathlib import Path

from ..errors import CorruptStoreError
from .crash import io_step
from .renames import rename_noreplace
from .temp import temp_path
from .trust import FileKind, Trust, apply_modes, check_fd, check_parent, check_stat, passes

__all__ = [
    "StoreWalk",
    "create_file",
    "make_dir",
    "map_file",
    "open_dir",
    "open_file",
    "open_regular",
    "open_regular_stat",
    "open_root",
    "open_sized",
]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: A directory: the root (which may be reached through a symlink).
_ROOT = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
#: A directory below a checked one.
_DIR = _ROOT | _NOFOLLOW
#: Added to the access mode of every file opened.
_FILE = os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC

_Name = str | os.PathLike[str]


# -- the shared steps ----------------------------------------------------------------------


def _blame_owner(
    exc: OSError, name: _Name, dir_fd: int | None, shown: _Name, trust: Trust
) -> None:
    """When the system refused ``name`` (``PermissionError``) because of its owner or mode,
    raise the policy's refusal, which says so and how to fix it."""
    if not isinstance(exc, PermissionError):
        return
    try:  # for the message only: nothing is opened or read
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    check_stat(st, shown, trust)


def _open(name: _Name, flags: int, dir_fd: int | None, shown: _Name, trust: Trust) -> int:
    """``os.open``; a refusal by the system is explained by the owner and mode when they are the cause."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError as exc:
        _blame_owner(exc, name, dir_fd, shown, trust)
        raise


def _not_regular(shown: _Name) -> CorruptStoreError:
    return CorruptStoreError(f"{shown} is not a regular file; refusing it", os.fspath(shown))


def _checked(fd: int, shown: _Name, trust: Trust, *, regular: bool = False) -> int:
    """Check a just-opened descriptor (and that it is a regular file); closed if refused."""
    try:
        st = check_fd(fd, shown, trust)
        if regular and not stat.S_ISREG(st.st_mode):
            raise _not_regular(shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- cache entries -------------------------------------------------------------------------


def make_dir(
    path: _Name, trust: Trust, *, dir_fd: int | None = None, exist_ok: bool = True
) -> bool:
    """Create one directory with the policy's mode; return whether it was created.

    An existing directory is left as it is (whoever opens it checks it). In a
    shared cache the directory appears with its group and mode already set
    (prepared under a temporary name, renamed into place without replacing
    anything): another member never finds it half made.
    """
    io_step("mkdir")
    if not trust.exact:
        try:
            os.mkdir(path, trust.dir_mode, dir_fd=dir_fd)
        except FileExistsError:
            if not exist_ok:
                raise
            return False
        return True
    try:  # the common case: it exists
        os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if not exist_ok:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path))
        return False
    tmp = temp_path(path, "new")
    os.mkdir(tmp, 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(tmp, _DIR, dir_fd=dir_fd)
        try:
            apply_modes(fd, trust, trust.dir_mode)
        finally:
            os.close(fd)
        io_step("rename")
        rename_noreplace(tmp, path, dir_fd=dir_fd)
    except FileExistsError:
        os.rmdir(tmp, dir_fd=dir_fd)
        if not exist_ok:
            raise
        return False
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(tmp, dir_fd=dir_fd)
        raise
    return True


def open_root(path: _Name, trust: Trust, *, create: bool = False) -> int:
    """Open the root directory of a cache (creating it if asked), check it and its parent.

    The root may be reached through symlinks (the user names it); what is
    checked is the directory actually opened, and the directory that
    actually holds it. Directories above the root are created with the
    umask's modes, as ``mkdir -p`` does.

    Raises
    ------
    UntrustedCacheError
        If the root or its parent fails the policy.
    FileNotFoundError
        If the root does not exist and ``create`` is false.
    """
    root = Path(os.fspath(path))
    if create:
        root.parent.mkdir(parents=True, exist_ok=True)
        make_dir(root, trust)
    fd = _checked(_open(root, _ROOT, None, root, trust), root, trust)
    if trust.kind == "explicit":
        return fd
    try:
        parent = os.open("..", _ROOT, dir_fd=fd)
        try:
            check_parent(os.fstat(parent), str(Path(os.path.realpath(root)).parent), trust)
        finally:
            os.close(parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir(
    path: _Name,
    trust: Trust,
    *,
    dir_fd: int | None = None,
    create: bool = False,
    shown: _Name | None = None,
) -> int:
    """Open a directory (not through a symlink), check it, return its descriptor.

    Parameters
    ----------
    path
        A name relative to ``dir_fd`` (or a path when ``dir_fd`` is None).
    trust
        The policy.
    dir_fd
        A checked directory to open ``path`` in.
    create
        Create it first if missing, with the policy's mode.
    shown
        The full path, for messages (default ``path``).
    """
    where = shown if shown is not None else path
    if create:
        make_dir(path, trust, dir_fd=dir_fd)
    return _checked(_open(path, _DIR, dir_fd, where, trust), where, trust)


def open_file(
    path: _Name, trust: Trust, *, dir_fd: int | None = None, shown: _Name | None = None
) -> int:
    """Open an existing regular file read-only, check it, return its descriptor.

    Raises
    ------
    FileNotFoundError
        If it does not exist.
    CorruptStoreError
        If it is not a regular file (a symlink, a FIFO, a device, ...).
    UntrustedCacheError
        If it fails the policy.
    """
    where = shown if shown is not None else path
    return _open_existing(path, os.O_RDONLY, dir_fd, where, trust)


def _open_existing(
    path: _Name, flags: int, dir_fd: int | None, where: _Name, trust: Trust
) -> int:
    return _checked(_open(path, flags | _FILE, dir_fd, where, trust), where, trust, regular=True)


def create_file(
    path: _Name,
    trust: Trust,
    *,
    dir_fd: int | None = None,
    flags: int = os.O_WRONLY,
    kind: FileKind = "data",
    exclusive: bool = True,
    shown: _Name | None = None,
) -> int:
    """Create a file with the policy's mode (``exclusive=False``: or open the existing one).

    A new file gets :attr:`Trust.file_mode` (``kind="data"``) or
    :attr:`Trust.member_write_mode` (``kind="member-write"``: lock files and
    other files every user of the cache writes); an existing one is checked
    like any other file.
    """
    where = shown if shown is not None else path
    mode = trust.mode_of(kind)
    base = flags | os.O_CREAT | _NOFOLLOW | _CLOEXEC
    if trust.exact and not exclusive:
        # others open it by name at any moment: it appears with its group and mode set
        try:
            return _open_existing(path, flags, dir_fd, where, trust)
        except FileNotFoundError:
            pass
        tmp = temp_path(path, "new")
        fd = os.open(tmp, base | os.O_EXCL, 0o600, dir_fd=dir_fd)
        try:
            apply_modes(fd, trust, mode)
            os.link(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileExistsError:
            os.close(fd)
            return _open_existing(path, flags, dir_fd, where, trust)
        except BaseException:
            os.close(fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        return fd
    try:
        fd = os.open(path, base | os.O_EXCL, mode, dir_fd=dir_fd)
    except FileExistsError:
        if exclusive:
            raise
        return _open_existing(path, flags, dir_fd, where, trust)
    try:
        if trust.exact:
            apply_modes(fd, trust, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- store files ---------------------------------------------------------------------------


def _refusal(
    path: _Name, shown: _Name, part: str, dir_fd: int, exc: OSError, final: bool, trust: Trust
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
    _blame_owner(exc, part, dir_fd, shown, trust)
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
    path: _Name, root: _Name, root_fd: int | StoreWalk | None = None, *,
    trust: Trust | None = None,
) -> int:
    """Open a store file read-only and return its descriptor.

    The path below ``root`` is walked one component at a time with
    ``O_NOFOLLOW``: a symlink anywhere inside the store is refused (it could
    lead outside it), and so is anything that is not a regular file. ``root``
    itself may be a symlink: that is the caller's choice.

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
    return open_regular_stat(path, root, root_fd, trust=trust)[0]


def _parts_below(path: str, root: str) -> list[str]:
    """The components of ``path`` below ``root``; CorruptStoreError if it is not below it."""
    if path.startswith(root) and path[len(root) : len(root) + 1] == "/" and root[-1:] != "/":
        parts = path[len(root) + 1 :].split("/")  # the common case: root / rel
        if "" not in parts and "." not in parts and ".." not in parts:
            return parts
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    if os.path.isabs(rel) or ".." in parts or "." in parts:
        raise CorruptStoreError(f"{path} is not inside the store {root}; refusing it", path)
    return parts


def open_regular_stat(
    path: _Name, root: _Name, root_fd: int | StoreWalk | None = None, *,
    trust: Trust | None = None,
) -> tuple[int, os.stat_result]:
    """:func:`open_regular`, and the ``fstat`` of the file it opened (checked already).

    ``root_fd`` may be a :class:`StoreWalk` of ``root``: the directories it opened
    already are not opened again (its ``trust`` is then the one checked).
    """
    if isinstance(root_fd, StoreWalk):
        return root_fd.open(path)
    shown, top = os.fspath(path), os.fspath(root)
    if trust is None:
        trust = Trust.explicit(top)
    if root_fd is not None:
        return _open_below(shown, top, root_fd, trust, None)
    try:
        fd = os.open(top, _ROOT)
    except OSError as exc:
        raise CorruptStoreError(f"{top} cannot be opened ({exc})", shown) from None
    try:
        check_fd(fd, top, trust)
        return _open_below(shown, top, fd, trust, None)
    finally:
        os.close(fd)


class StoreWalk:
    """Opens files below a store directory as :func:`open_regular` does, each directory
    once: a directory checked on the way to one file is kept open (until :meth:`close`)
    for the next files below it. Directories named by a number (a chunk's, one per file)
    are not kept.

    Pass it as ``root_fd`` to :func:`open_regular` and the functions that call it.

    Parameters
    ----------
    root
        The store directory (the paths given are below it).
    root_fd
        A descriptor of ``root``, checked by its opener (not closed here).
    trust
        Checked on every descriptor opened.
    """

    def __init__(self, root: _Name, root_fd: int, trust: Trust) -> None:
        self.root = os.fspath(root)
        self.root_fd = root_fd
        self.trust = trust
        self._dirs: dict[str, int] = {}

    def open(self, path: _Name) -> tuple[int, os.stat_result]:
        """Open the store file ``path`` (below the root); its descriptor and ``fstat``."""
        return _open_below(os.fspath(path), self.root, self.root_fd, self.trust, self._dirs)

    def close(self) -> None:
        """Close the directories kept open."""
        dirs, self._dirs = self._dirs, {}
        for fd in dirs.values():
            os.close(fd)

    def __enter__(self) -> StoreWalk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_below(
    shown: str, top: str, root_fd: int, trust: Trust, kept: dict[str, int] | None
) -> tuple[int, os.stat_result]:
    """Open the store file ``shown`` below ``top`` (open at ``root_fd``), one component at a
    time; directories go to ``kept`` (by path below ``top``) unless named by a number."""
    parts = _parts_below(shown, top)
    dir_fd, owned, below = root_fd, None, ""
    try:
        for part in parts[:-1]:
            below = f"{below}/{part}" if below else part
            if kept is not None and (known := kept.get(below)) is not None:
                dir_fd = known
                continue
            try:
                sub = os.open(part, _DIR, dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(shown, f"{top}/{below}", part, dir_fd, exc, False, trust) from None
            if owned is not None:
                os.close(owned)
            dir_fd = owned = sub
            st = os.fstat(sub)
            if not passes(st, trust):  # the path is built only when needed
                check_stat(st, f"{top}/{below}", trust)
            if kept is not None and not part.isdigit():
                kept[below], owned = sub, None
        try:
            fd = os.open(parts[-1], os.O_RDONLY | _FILE, dir_fd=dir_fd)
        except OSError as exc:
            raise _refusal(shown, shown, parts[-1], dir_fd, exc, True, trust) from None
    finally:
        if owned is not None:
            os.close(owned)
    try:
        st = os.fstat(fd)
        if not passes(st, trust):
            check_stat(st, shown, trust)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(shown)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_sized(
    path: _Name,
    root: _Name,
    expected_size: int,
    root_fd: int | StoreWalk | None = None,
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
    fd, st = open_regular_stat(path, root, root_fd, trust=trust)
    if st.st_size != expected_size:
        os.close(fd)
        raise CorruptStoreError(
            f"{path} is {st.st_size} bytes but the store recorded {expected_size}; the file "
            "was truncated or overwritten - rebuild the store",
            os.fspath(path),
        )
    return fd


def map_file(
    path: _Name,
    root: _Name,
    expected_size: int,
    *,
    root_fd: int | StoreWalk | None = None,
    trust: Trust | None = None,
) -> mmap.mmap | None:
    """Map a whole store file read-only after checking its size; ``None`` for an empty file.

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
        return mmap.mmap(fd, expected_size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
