"""Settings in one place: version, environment variables, size caps, names, modes.

Every module reads these names from here, as attributes of this module at the
time of use (``config.MAX_GROUP_JSON``), so a caller that changes one (a test
with ``monkeypatch.setattr(config, ...)``) changes it everywhere.

Environment variables
---------------------
``TSC_CACHE_DIR``
    The default cache directory of :func:`~tensorstore_cache.cached`,
    :func:`~tensorstore_cache.gc` and remote stores.
``TSC_CACHE_LOCKS``
    ``0`` (or ``off``/``false``/``no``) turns file locking off, for mounts where
    ``flock`` hangs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, get_args

__all__ = [
    "BUILD_MARK",
    "CACHE_DIR_ENV",
    "FETCH_MARK",
    "GC_MARK",
    "LOCKS_ENV",
    "MAX_ARRAY_JSON",
    "MAX_DEPTH",
    "MAX_GROUP_JSON",
    "MAX_VALUES",
    "SHARD_BYTES",
    "Check",
    "Missing",
    "OnError",
    "OnStale",
    "__version__",
    "check_mode",
    "default_cache_dir",
]

__version__ = "0.1.0"

#: Environment variable naming the default cache directory.
CACHE_DIR_ENV = "TSC_CACHE_DIR"
#: Environment variable that turns file locking off when set to ``0``.
LOCKS_ENV = "TSC_CACHE_LOCKS"

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

#: Marks in the names of temporary siblings (``.<target><mark><host>-<pid>-<random>``):
#: a build directory, a download directory, a directory ``gc`` is deleting.
BUILD_MARK = ".tsc-build-"
FETCH_MARK = ".tsc-fetch-"
GC_MARK = ".tsc-gc-"

OnError = Literal["raise", "skip"]
"""What a build does with a source that fails to load."""
Check = Literal["stat", "hash"]
"""How a cached entry is known to be current."""
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
    allowed = get_args(mode)
    if not isinstance(value, str) or value not in allowed:
        choices = ", ".join(repr(a) for a in allowed[:-1]) + f" or {allowed[-1]!r}"
        raise ValueError(f"{name} must be {choices}, got {value!r}")
    return value


def default_cache_dir() -> Path:
    """Return ``$TSC_CACHE_DIR``, else ``$XDG_CACHE_HOME/tensorstore_cache``, else ``~/.cache/tensorstore_cache``."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tensorstore_cache"
