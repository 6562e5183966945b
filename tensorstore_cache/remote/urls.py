"""URLs of remote stores and the node-local directory their copies go to.

A store at an fsspec URL (``s3://``, ``gs://``, ``memory://``, ...) is read
through the node cache, one directory per version: ``<cache_dir>/remote/<name>-<hash of
URL>/<XXH3-128 of its group zarr.json>/`` and mapped from there.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import xxhash

from .. import config
from ..fs import Trust, open_dir, open_root

__all__ = [
    "file_url_path",
    "filesystem",
    "is_url",
    "node_dir",
    "open_url_dir",
    "remote_cache_root",
    "url_dir",
    "version_name",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*://")


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def file_url_path(url: str) -> Path | None:
    """Return the local path of a ``file://`` URL, ``None`` for any other URL."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme.lower() != "file":
        return None
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{url!r} names a file on host {parsed.netloc!r}; use a local path")
    return Path(urllib.parse.unquote(parsed.path))


def remote_cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the directory under which remote stores are copied (``<cache_dir>/remote``)."""
    return config.cache_root(cache_dir) / "remote"


def open_url_dir(
    url: str, cache_dir: str | os.PathLike[str] | None, trust: Trust, *, create: bool = False
) -> int:
    """Open (or create) the node-cache directory of ``url``; return its checked descriptor.

    The cache directory, ``remote/`` and the URL's directory are opened one
    in the other and each checked against ``trust`` (see
    :mod:`tensorstore_cache.fs.trust`); created with its modes if ``create``.

    Raises
    ------
    FileNotFoundError
        If one is missing and ``create`` is false.
    UntrustedCacheError
        If one fails ``trust``.
    """
    root = config.cache_root(cache_dir)
    top = open_root(root, trust, create=create)
    try:
        remote = open_dir("remote", trust, dir_fd=top, create=create, shown=root / "remote")
    finally:
        os.close(top)
    try:
        name = url_dir(url)
        return open_dir(name, trust, dir_fd=remote, create=create, shown=root / "remote" / name)
    finally:
        os.close(remote)


def filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """Return the fsspec filesystem of ``url`` and the store's path on it."""
    try:
        import fsspec.core
    except ImportError:  # pragma: no cover - fsspec is installed with the remote extra
        raise ImportError(
            f"opening {url!r} needs fsspec (and the filesystem's package, e.g. s3fs): "
            "pip install 'tensorstore_cache[remote]'"
        ) from None
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, str(root).rstrip("/")


def _fresh_fsspec_loop_in_child() -> None:
    """Drop fsspec's event loop and its thread in a forked child (fsspec < 2025.7 kept them).

    The parent's loop runs in a thread the child does not have: every call of an async
    filesystem (s3fs) made in the child waited on it for ever. fsspec's own ``reset_lock``
    (in every release the bounds allow) makes the child start its own loop on first use;
    newer releases do the same at fork themselves, and doing it twice is harmless.
    """
    asyn = sys.modules.get("fsspec.asyn")
    if asyn is not None and getattr(asyn, "reset_lock", None) is not None:
        asyn.reset_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_fsspec_loop_in_child)


def url_dir(url: str) -> str:
    """Cache directory name of a URL: a readable tail plus the hash of the whole URL."""
    canonical = url.rstrip("/")
    tail = re.sub(r"[^A-Za-z0-9._-]", "_", canonical.rsplit("/", 1)[-1])[:48] or "store"
    return f"{tail}-{xxhash.xxh3_64_hexdigest(canonical.encode())}"


def node_dir(url: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the directory of this node's copies of the store at ``url`` (not created)."""
    return remote_cache_root(cache_dir) / url_dir(url)


def version_name(group: bytes) -> str:
    """Name of the copy of one version of a store: the XXH3-128 of its group ``zarr.json``."""
    return xxhash.xxh3_128_hexdigest(group)
