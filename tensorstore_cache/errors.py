"""Exceptions raised by tensorstore_cache.

Every error inherits from :class:`TensorStoreCacheError` and from the built-in
exception a caller would already catch for the same situation::

    TensorStoreCacheError (Exception)
    ├── BuildError (RuntimeError)            some sources could not be turned into vectors
    ├── CorruptStoreError (ValueError)       files on disk do not match what the store promises
    │   └── StoreReplacedError               a remote store changed after this process opened it
    ├── KeyNotInStoreError (KeyError)        a looked-up path is not in the store
    ├── ReentrantBuildError (RuntimeError)   a build's own loader or worker asks for that build
    ├── StaleSourceError (ValueError)        cached entries whose source changed since
    ├── StoreExistsError (FileExistsError)   the build target already exists
    ├── StoreLockedError (TimeoutError)      waiting for another builder's lock timed out
    ├── StoreNotFoundError (FileNotFoundError)  no store at the given location
    ├── UnsafeRemoteError (OSError)          a remote= store that ignores create-only writes
    └── UntrustedCacheError (PermissionError)   a cache file someone untrusted could have written

    StorePermissionWarning (UserWarning)     a store opened by path that others can write

Errors keep their data as attributes and survive pickling, so they travel
unchanged from worker processes to the caller.

:class:`CacheLimitWarning` (a :class:`RuntimeWarning`) says, once per cause,
that the node cache of remote stores is over its cap, thrashing, or not local.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import Any

__all__ = [
    "BuildError",
    "CacheLimitWarning",
    "CorruptStoreError",
    "KeyNotInStoreError",
    "LoaderFingerprintWarning",
    "ReentrantBuildError",
    "StaleSourceError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StorePermissionWarning",
    "StoreReplacedError",
    "TensorStoreCacheError",
    "UnnamedLoaderError",
    "UnsafeRemoteError",
    "UntrustedCacheError",
    "warn_once",
]

#: The causes warned about already in this process (see :func:`warn_once`).
_WARNED: set[Hashable] = set()


def warn_once(key: Hashable, message: str, category: type[Warning], *, stacklevel: int = 2) -> bool:
    """Warn ``message`` unless this process warned of ``key`` already; return whether it did.

    The one way the library says something once per cause (a store others can write, a node
    cache on a network filesystem, a cap that everything mapped exceeds).

    Parameters
    ----------
    key
        The cause, e.g. ``("node-cache", path)``: each distinct key warns once.
    message
        What the warning says.
    category
        Its class.
    stacklevel
        As :func:`warnings.warn`'s, counted from the caller of this function.
    """
    if key in _WARNED:
        return False
    _WARNED.add(key)
    warnings.warn(message, category, stacklevel=stacklevel + 1)
    return True


class TensorStoreCacheError(Exception):
    """Base class of every error raised by tensorstore_cache.

    Every error is also the built-in a caller would catch anyway (see this
    module's tree), and keeps its data as attributes.

    Examples
    --------
    >>> try:
    ...     tsc.open_store("no-such.tsc")
    ... except tsc.TensorStoreCacheError as err:
    ...     print(type(err).__name__, isinstance(err, FileNotFoundError))
    StoreNotFoundError True
    """


class BuildError(TensorStoreCacheError, RuntimeError):
    """Some sources could not be loaded, so nothing was published.

    Parameters
    ----------
    message
        Summary of what went wrong and how to proceed.
    failures
        Every failing source as ``(path, reason)``, in input order.

    Attributes
    ----------
    failures : list of tuple of (str, str)
        Every failing source and the reason it failed.

    Examples
    --------
    >>> _ = open("broken.jpg", "wb").write(b"not an image")
    >>> try:
    ...     tsc.build_store([*paths, "broken.jpg"], "covers.tsc", progress=False)
    ... except tsc.BuildError as err:
    ...     print([path for path, reason in err.failures])
    ['broken.jpg']
    """

    def __init__(self, message: str, failures: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.failures: list[tuple[str, str]] = [(str(p), str(r)) for p, r in failures]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.failures))


class CorruptStoreError(TensorStoreCacheError, ValueError):
    """A store's files are damaged, incomplete or not a tensorstore_cache store.

    Attributes
    ----------
    path : str or None
        The offending file, when one file is to blame (the first one otherwise).
    files : list of str
        Every offending file known (``[path]`` for a single one, all the bad
        files found by ``verify``).

    Examples
    --------
    >>> store = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> with open("covers.tsc/key_bytes/c/0", "r+b") as f:  # one byte changed
    ...     _ = f.write(b"X")
    >>> try:
    ...     store.verify()
    ... except tsc.CorruptStoreError as err:
    ...     print(err.files)
    ['covers.tsc/key_bytes/c/0']
    """

    def __init__(
        self, message: str, path: str | None = None, files: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.files: list[str] = [str(f) for f in files] or ([path] if path is not None else [])
        self.path = path if path is not None else (self.files[0] if self.files else None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.path, self.files))


class KeyNotInStoreError(TensorStoreCacheError, KeyError):
    """One or more looked-up paths are not in the store.

    Attributes
    ----------
    missing : list of str
        The normalised keys that were not found (all of them, in query order).

    Examples
    --------
    >>> store = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> try:
    ...     store.rows(["no/such.jpg", paths[0], "nor//this.jpg"])
    ... except KeyError as err:
    ...     print(err.missing)
    ['no/such.jpg', 'nor/this.jpg']
    """

    def __init__(self, missing: Sequence[str]) -> None:
        self.missing = [str(m) for m in missing]
        shown = ", ".join(repr(m) for m in self.missing[:5])
        more = f" and {len(self.missing) - 5} more" if len(self.missing) > 5 else ""
        super().__init__(
            f"{len(self.missing)} path(s) not in the store: {shown}{more}; "
            "build them into the store (or use tensorstore_cache.cached) or look up "
            "with .get() to accept misses"
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.missing,))


class ReentrantBuildError(TensorStoreCacheError, RuntimeError):
    """A build was asked for from inside itself: by its loader, or one of its worker processes.

    The process building a cache holds the cache's build lock until its
    workers finish; a worker (or the building process's own loader) that
    asked to build the same cache would wait for that lock forever. It fails
    at once with this error instead, naming the cache and the process that
    builds it.

    Attributes
    ----------
    path : str
        The cache namespace or store directory that is being built.

    Examples
    --------
    >>> def loader(path):  # asks for the cache it is filling
    ...     tsc.cached([path], loader=loader, loader_id="demo.reentrant/1", workers=1)
    >>> try:
    ...     tsc.cached(paths, loader=loader, loader_id="demo.reentrant/1", workers=1,
    ...                progress=False)
    ... except tsc.BuildError as err:  # the loader's error, for every source
    ...     print(err.failures[0][1].split(":")[0])
    ReentrantBuildError
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.path))


class StaleSourceError(TensorStoreCacheError, ValueError):
    """Cached entries were computed from sources that have changed since.

    Attributes
    ----------
    stale : list of str
        The keys of the stale entries (all of them, in query order).

    Examples
    --------
    >>> store = tsc.cached(paths, progress=False)
    >>> _ = open(paths[0], "ab").write(b"more bytes")  # the source changes
    >>> try:
    ...     tsc.cached(paths, on_stale="raise")
    ... except tsc.StaleSourceError as err:
    ...     print(err.stale == [paths[0]])
    True
    """

    def __init__(self, stale: Sequence[str]) -> None:
        self.stale = [str(s) for s in stale]
        shown = ", ".join(repr(s) for s in self.stale[:5])
        more = f" and {len(self.stale) - 5} more" if len(self.stale) > 5 else ""
        super().__init__(
            f"{len(self.stale)} cached entries are stale (their source changed or vanished "
            f"since they were computed): {shown}{more}; pass on_stale='rebuild' to recompute "
            "them, or on_stale='ignore' to use them as they are"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.stale,))


class StoreExistsError(TensorStoreCacheError, FileExistsError):
    """The build target already exists and ``overwrite`` was not requested.

    Examples
    --------
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> try:
    ...     tsc.build_store(paths, "covers.tsc", progress=False)
    ... except FileExistsError as err:
    ...     print(type(err).__name__)
    StoreExistsError
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False, overwrite=True)
    """


class StoreLockedError(TensorStoreCacheError, TimeoutError):
    """Another process holds the store's build lock for longer than allowed.

    Raised by :func:`~tensorstore_cache.cached` after ``lock_timeout`` seconds.

    Examples
    --------
    >>> import fcntl, os
    >>> _ = tsc.cached(paths[:4], progress=False)
    >>> [cache] = tsc.list_caches()
    >>> fd = os.open(os.path.join(cache.path, "lock"), os.O_RDWR)
    >>> fcntl.flock(fd, fcntl.LOCK_EX)  # as a build in another process would
    >>> try:
    ...     tsc.cached(paths, lock_timeout=0.1)  # four new paths: it must build
    ... except TimeoutError as err:
    ...     print(type(err).__name__)
    StoreLockedError
    >>> os.close(fd)
    """


class StoreNotFoundError(TensorStoreCacheError, FileNotFoundError):
    """There is no store at the given location.

    Examples
    --------
    >>> try:
    ...     tsc.open_store("no-such.tsc")
    ... except FileNotFoundError as err:
    ...     print(err)
    no store at 'no-such.tsc'; build one with tensorstore_cache.build_store (or check the path)
    """


class UnsafeRemoteError(TensorStoreCacheError, OSError):
    """The ``remote=`` of :func:`~tensorstore_cache.cached` ignores create-only writes.

    A one-time probe creates one object twice (``If-None-Match: *`` on S3, a
    hard link on a shared directory); when the second create replaces the
    first, machines could overwrite each other's commits, so the remote is
    refused. The verdict is kept in the node cache (the message names the file
    to delete to probe again).
    """


class UntrustedCacheError(TensorStoreCacheError, PermissionError):
    """A cache directory or file could have been written by someone the cache must not trust.

    Raised before anything in it is read: by :func:`~tensorstore_cache.cached`
    and for the node-local copies of remote stores, when a directory or file is
    owned by another user, or writable by others (see the README, "Private and
    shared caches"). The message names the path, its owner and mode, and the fix.

    Attributes
    ----------
    path : str
        The refused directory or file.
    uid, gid : int
        Its owner and group.
    mode : int
        Its ``st_mode``.
    reason : str
        Why, in a few words (``"owned by uid 1001"``), as ``tensorstore-cache ls`` shows it.

    Examples
    --------
    >>> import os
    >>> _ = tsc.cached(paths, progress=False)
    >>> [cache] = tsc.list_caches()
    >>> os.chmod(cache.path, 0o777)  # anyone could now plant vectors in it
    >>> try:
    ...     tsc.cached(paths)
    ... except PermissionError as err:
    ...     print(type(err).__name__, err.mode & 0o777 == 0o777)
    UntrustedCacheError True
    """

    def __init__(
        self, message: str, path: str = "", uid: int = -1, gid: int = -1, mode: int = 0,
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.path = path
        self.uid = uid
        self.gid = gid
        self.mode = mode
        self.reason = reason

    def __str__(self) -> str:  # PermissionError would format (errno, strerror) otherwise
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.path, self.uid, self.gid, self.mode, self.reason))


class StorePermissionWarning(UserWarning):
    """A store opened by its path has directories or files that other users can write.

    Opening a store you name is your choice, like opening any file, so it is
    not refused; this warning (once per store) says that someone else could
    change what it returns.

    Examples
    --------
    >>> import os, warnings
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> os.chmod("covers.tsc", 0o777)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     store = tsc.open_store("covers.tsc")
    >>> [w.category.__name__ for w in caught]
    ['StorePermissionWarning']
    """


class StoreReplacedError(CorruptStoreError):
    """The store at a URL was replaced after this process opened it: reopen it.

    Raised for a shard of the opened version that this node had not fetched
    yet and whose remote bytes no longer match; shards already fetched keep
    working. ``path`` names the remote object.

    Examples
    --------
    >>> issubclass(tsc.StoreReplacedError, tsc.CorruptStoreError)  # never wrong data
    True
    """


class CacheLimitWarning(RuntimeWarning):
    """The node cache of remote stores needs attention: over its cap (every other shard in
    it is mapped), thrashing (rows read span more than the cap), or on a network filesystem.

    Said once per cause; the reads go on. Turn it into an error where a job must
    not run past the cap: ``warnings.simplefilter("error", tsc.CacheLimitWarning)``.

    Examples
    --------
    >>> issubclass(tsc.CacheLimitWarning, RuntimeWarning)
    True
    """


class UnnamedLoaderError(TensorStoreCacheError, ValueError):
    """A loader holds something that has no content to name it by: give it a ``loader_id``.

    Open files, sockets, generators, random generators, opaque extension objects,
    code that writes enclosing state with ``nonlocal`` and arrays past the
    fingerprint's cap are refused, never guessed. ``path`` is the way from the
    loader to what was refused, e.g. ``"load -> MODEL -> ._session (sqlite3.Connection)"``.

    Examples
    --------
    >>> issubclass(tsc.UnnamedLoaderError, ValueError)
    True
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message, path)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return self.message


class LoaderFingerprintWarning(UserWarning):
    """A loader's automatic fingerprint moves: per-run state, or state its calls change.

    A loader whose fingerprint depends on a value made anew in each run (a global
    ``uuid4()`` or ``time()``) gets a new cache namespace each run; one that
    changes an attribute while it computes had another fingerprint after its
    build. The message names the component that moved; give the loader a
    ``loader_id`` or keep that value out of it.

    Examples
    --------
    >>> issubclass(tsc.LoaderFingerprintWarning, UserWarning)
    True
    """
