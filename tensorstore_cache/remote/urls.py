"""URLs of remote stores and the node-local directory their copies go to.

A store at an fsspec URL (``s3://``, ``gs://``, ``memory://``, ...) is read
through the node cache, one directory per version: ``<cache_dir>/remote/<name>-<hash of
URL>/<XXH3-128 of its group zarr.json>/`` and mapped from there.
"""

from __future__ import annotations

import dataclasses
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
    "SHARED_SCHEMES",
    "file_url_path",
    "filesystem",
    "is_url",
    "node_dir",
    "open_url_dir",
    "public_options",
    "redact",
    "reduce_public",
    "remote_cache_root",
    "shared_scheme",
    "url_dir",
    "version_name",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*://")
#: Query parameters that carry a credential (an Azure SAS, a presigned S3 URL, a token).
_SECRET_PARAMS = re.compile(
    r"(?i)^(sig|signature|se|sp|sv|st|spr|srt|ss|sr|skoid|sktid|skt|ske|sks|skv|"
    r"x-amz-.*|x-goog-.*|token|access_token|key|secret|password|credential|sas|code)$")

_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://)[^:/?#@]*:.*@(?P<rest>[^@]*)$",
                       re.DOTALL)

#: The URL schemes a cache can be shared through by ``cached(remote=...)``, by the package
#: that gives their create-only write: those of a store with conditional creates
#: (``If-None-Match: *``, ``ifGenerationMatch=0``), and ``file`` (a shared directory).
SHARED_SCHEMES: dict[str, str] = {
    "s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
    "abfs": "adlfs", "abfss": "adlfs", "file": "",
}


def redact(url: str) -> str:
    """``url`` with any credential in it replaced by ``***``: a ``user:password@`` part,
    and every query parameter that may carry one (a SAS signature, a token).

    Examples
    --------
    >>> redact("s3://AKIA:hunter2@bucket/prefix?versionId=3&X-Amz-Signature=abc")
    's3://***@bucket/prefix?versionId=3&X-Amz-Signature=***'
    """
    if not is_url(url):
        return url
    # user:password@ before the host; a password may hold "/" (an AWS secret key), "?", "#"
    user = _USERINFO.match(url)
    if user is not None:
        url = f"{user['head']}***@{user['rest']}"
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    query = "&".join(
        f"{k}={'***' if _SECRET_PARAMS.match(urllib.parse.unquote(k)) else v}" if eq else k
        for k, eq, v in (q.partition("=") for q in parts.query.split("&") if q))
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


#: Names of ``storage_options`` entries (at any depth) that hold a credential: s3fs's
#: ``key``/``secret``/``token``, botocore's ``aws_*``, gcsfs's ``token``, adlfs's
#: ``account_key``/``sas_token``/``connection_string``/``client_secret``/``credential``.
_SECRET_OPTIONS = re.compile(
    r"(?i)^(key|secret|token|password|passwd|credentials?|connection_string|sas_token|"
    r"account_key|client_secret|session_token|aws_access_key_id|aws_secret_access_key|"
    r"aws_session_token|access_token|refresh_token|private_key)$")


def public_options(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``options`` without the entries that hold a credential (see :data:`_SECRET_OPTIONS`):
    what a store's pickle keeps of its ``storage_options``. A process that unpickles it reads
    with the credentials of its own environment (``AWS_*``, an instance role, ...).

    Examples
    --------
    >>> public_options({"key": "AKIA", "secret": "s", "endpoint_url": "http://minio:9000",
    ...                 "client_kwargs": {"region_name": "eu", "aws_session_token": "t"}})
    {'endpoint_url': 'http://minio:9000', 'client_kwargs': {'region_name': 'eu'}}
    """
    if options is None:
        return None
    return {k: public_options(v) if isinstance(v, Mapping) else v
            for k, v in options.items() if not _SECRET_OPTIONS.match(str(k))}


def reduce_public(location: Any) -> tuple[Any, ...]:
    """``__reduce__`` of a location dataclass with ``storage_options``: pickled with
    :func:`public_options` of them, so that no pickle of a store holds a credential."""
    fields = {f.name: getattr(location, f.name) for f in dataclasses.fields(location)}
    fields["storage_options"] = public_options(fields["storage_options"])
    return _construct, (type(location), fields)


def _construct(cls: type[Any], fields: dict[str, Any]) -> Any:
    return cls(**fields)


def shared_scheme(url: str) -> str:
    """The scheme of a ``remote=`` URL, checked (see :data:`SHARED_SCHEMES`).

    Raises
    ------
    ValueError
        If no store of that scheme is known to give create-only writes (the
        message names the URL, credentials redacted, and what is supported), or
        the URL holds credentials.
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in SHARED_SCHEMES:
        raise ValueError(
            f"remote={redact(url)!r}: a cache is shared only through a store with create-only "
            "writes: s3:// (AWS S3, MinIO, Cloudflare R2, Ceph RGW), gs:// (Google Cloud "
            "Storage), az:// or abfs:// (Azure Blob Storage), or a directory every machine "
            "mounts (a path or file://); read stores at other URLs with open_store()"
        )
    if redact(url) != url:
        raise ValueError(
            f"remote={redact(url)!r} holds credentials, which its filesystem does not read "
            "from a URL (and which would show wherever the URL is shown): give them in "
            "storage_options= or the store's usual environment variables"
        )
    return scheme


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
    """Cache directory name of a URL: a readable tail plus the hash of the whole URL (its
    credentials redacted first: a name never shows them)."""
    canonical = redact(url).rstrip("/")
    tail = re.sub(r"[^A-Za-z0-9._-]", "_", canonical.rsplit("/", 1)[-1])[:48] or "store"
    return f"{tail}-{xxhash.xxh3_64_hexdigest(canonical.encode())}"


def node_dir(url: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the directory of this node's copies of the store at ``url`` (not created)."""
    return remote_cache_root(cache_dir) / url_dir(url)


def version_name(group: bytes) -> str:
    """Name of the copy of one version of a store: the XXH3-128 of its group ``zarr.json``."""
    return xxhash.xxh3_128_hexdigest(group)
