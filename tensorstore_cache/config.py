"""Settings in one place: version, environment variables, size caps, names, modes.

Every module reads these names from here, as attributes of this module at the
time of use (``config.MAX_GROUP_JSON``), so a caller that changes one (a test
with ``monkeypatch.setattr(config, ...)``) changes it everywhere.

Environment variables
---------------------
``TSC_CACHE_DIR``
    The default cache directory of :func:`~tensorstore_cache.cached`,
    :func:`~tensorstore_cache.gc` and remote stores.
``TSC_CACHE_GROUP``
    The group caches are shared with (a group name or a numeric gid) when
    ``share_with`` is not given; unset or empty: private caches.
``TSC_CACHE_LOCKS``
    ``0`` (or ``off``/``false``/``no``) turns file locking off, for mounts where
    ``flock`` hangs.
``TSC_WORKER_START``
    ``spawn`` starts every worker of a build's pool as a fresh interpreter; unset
    or ``auto``: forked from the building process where that is safe.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_GROUP_ENV",
    "Identity",
    "IdentityKind",
    "LOCKS_ENV",
    "LocalCopy",
    "MAX_ARRAY_JSON",
    "MAX_BYTES_ENV",
    "MAX_DEPTH",
    "MAX_GROUP_JSON",
    "MAX_VALUES",
    "MIN_SHARD_ROWS",
    "Missing",
    "OnError",
    "OnStale",
    "REMOTE_ENV",
    "Recorded",
    "SHARD_BYTES",
    "SourceCheck",
    "WORKER_START_ENV",
    "__version__",
    "cache_root",
    "check_mode",
    "choices",
    "default_cache_dir",
]

__version__ = "0.1.0"
"""The version of tensorstore_cache (the package's metadata names the same)."""

#: Environment variable naming the default cache directory.
CACHE_DIR_ENV = "TSC_CACHE_DIR"
#: Environment variable naming the group caches are shared with (a name or a numeric gid).
CACHE_GROUP_ENV = "TSC_CACHE_GROUP"
#: Environment variable capping the node cache of remote stores (bytes; see ``open_store``).
MAX_BYTES_ENV = "TSC_CACHE_MAX_BYTES"
#: Environment variable that turns file locking off when set to ``0``.
LOCKS_ENV = "TSC_CACHE_LOCKS"
#: The remote prefix a cached() call shares its namespace through (cached(remote=...)).
REMOTE_ENV = "TSC_REMOTE"
#: Environment variable that makes a build's workers fresh interpreters when ``spawn``.
WORKER_START_ENV = "TSC_WORKER_START"

#: Largest group ``zarr.json`` a reader accepts (it lists every file and skipped source).
MAX_GROUP_JSON = 64 << 20
#: Largest array ``zarr.json`` a reader accepts.
MAX_ARRAY_JSON = 64 << 10
#: Deepest nesting accepted in a metadata file.
MAX_DEPTH = 32
#: Most JSON values (roughly: commas and brackets) accepted in a metadata file,
#: counted before decoding so that a small file cannot expand into gigabytes of objects.
MAX_VALUES = 2_000_000

#: Target size of one shard file written by a build.
SHARD_BYTES = 32 << 20
#: Fewest rows in a shard of a build (unless the build has fewer).
MIN_SHARD_ROWS = 64

LocalCopy = Literal["auto", "always", "never"]
"""Whether a store opened by path is read through the node cache (``open_store``)."""

OnError = Literal["raise", "skip"]
"""What a build does with a source that fails to load."""
IdentityKind = Literal["stat", "content", "none"]
"""How users name the way a source's entry is known to be current (``identity=``): its size
and mtime, its content's hash, or not at all; a function giving version tokens is the
fourth way (:data:`Identity`)."""
Identity = IdentityKind | Callable[[list[str]], Any]
"""What ``identity=`` takes: a kind, or a function ``keys -> uint64 array`` of version tokens."""
SourceCheck = Literal[IdentityKind, "token"]
"""How a build records its sources and how a check compares them: by stat, by stat plus a
content hash of every source (``"content"``), not at all, or by version tokens."""
Recorded = Literal["stat", "none", "token"]
"""What a store's metadata records about its sources (on disk): size and mtime (a
``"content"`` build writes ``"stat"`` and its hashes beside its part), nothing, or version
tokens."""
OnStale = Literal["rebuild", "raise", "ignore"]
"""What :func:`~tensorstore_cache.cached` does with stale entries."""
Missing = Literal["raise", "ignore"]
"""What :meth:`~tensorstore_cache.CacheStore.rows` does with absent paths."""


def check_mode(name: str, value: object, mode: Any) -> Any:
    """Return ``value`` if it is one of the ``Literal`` type ``mode``'s values, else raise.

    Parameters
    ----------
    name
        The option's name, for the message.
    value
        What the caller passed.
    mode
        One of the mode types above (e.g. :data:`OnError`).

    Raises
    ------
    ValueError
        Naming the option, the allowed values and the value given.

    Examples
    --------
    >>> check_mode("on_error", "skip", OnError)
    'skip'
    """
    if not isinstance(value, str) or value not in get_args(mode):
        raise ValueError(f"{name} must be {choices(mode)}, got {value!r}")
    return value


def choices(mode: Any) -> str:
    """The values of the ``Literal`` type ``mode``, as a message lists them.

    Parameters
    ----------
    mode
        One of the mode types above (e.g. :data:`Recorded`).

    Examples
    --------
    >>> choices(Recorded)
    "'stat', 'none' or 'token'"
    """
    allowed = get_args(mode)
    return ", ".join(repr(a) for a in allowed[:-1]) + f" or {allowed[-1]!r}"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the cache directory: ``cache_dir`` (``~`` expanded), else :func:`default_cache_dir`.

    The one place the cache directory of a call is computed.

    Examples
    --------
    >>> cache_root("/data/tsc")
    PosixPath('/data/tsc')
    """
    if cache_dir is None:
        return default_cache_dir()
    return Path(os.fspath(cache_dir)).expanduser()


def default_cache_dir() -> Path:
    """Return ``$TSC_CACHE_DIR``, else ``$XDG_CACHE_HOME/tensorstore_cache``, else ``~/.cache/tensorstore_cache``."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tensorstore_cache"
