"""Exceptions raised by tensorstore_cache.

Every error inherits from :class:`TensorStoreCacheError` and from the built-in
exception a caller would already catch for the same situation::

    TensorStoreCacheError (Exception)
    ├── BuildError (RuntimeError)            some sources could not be turned into vectors
    ├── CorruptStoreError (ValueError)       files on disk do not match what the store promises
    ├── KeyNotInStoreError (KeyError)        a looked-up path is not in the store
    ├── ReentrantBuildError (RuntimeError)   a build's own loader or worker asks for that build
    ├── StaleSourceError (ValueError)        cached entries whose source changed since
    ├── StoreExistsError (FileExistsError)   the build target already exists
    ├── StoreLockedError (TimeoutError)      waiting for another builder's lock timed out
    └── StoreNotFoundError (FileNotFoundError)  no store at the given location

Errors keep their data as attributes and survive pickling, so they travel
unchanged from worker processes to the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "BuildError",
    "CorruptStoreError",
    "KeyNotInStoreError",
    "ReentrantBuildError",
    "StaleSourceError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "TensorStoreCacheError",
]


class TensorStoreCacheError(Exception):
    """Base class of every error raised by tensorstore_cache."""


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
    """The build target already exists and ``overwrite`` was not requested."""


class StoreLockedError(TensorStoreCacheError, TimeoutError):
    """Another process holds the store's build lock for longer than allowed."""


class StoreNotFoundError(TensorStoreCacheError, FileNotFoundError):
    """There is no store at the given location."""
