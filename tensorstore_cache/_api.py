"""The verbs: :func:`open_store`, :func:`build_store`, :func:`cached`, :func:`verify_store`.

This is the only module that routes a location: an fsspec URL goes through
the remote transport (a node-local copy), a cache namespace directory to the
cache, a store directory to the reader. It also checks every option once
and turns the keyword arguments into the options objects the layers below
take.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from . import config
from .cache import CacheOptions, NamespaceDirectory, RemoteOptions, cached_store, is_namespace
from .config import Identity, LocalCopy, OnError, OnStale, check_mode
from .errors import CacheLimitWarning, CorruptStoreError, StoreNotFoundError, warn_once
from .format import (
    GROUP,
    Field,
    Problem,
    VerifyReport,
    normalize_keys,
    verify_segment,
)
from .fs import Trust, network_mount, resolve_trust
from .identity import check_loader_id, loader_fingerprint
from .loaders import BatchLoader, Loader, resolve_loader
from .reader import (
    CacheStore,
    Location,
    StoreDirectory,
    open_directory,
    resolve_identity,
    token_map,
)
from .remote import (
    RemoteStore,
    check_target,
    file_url_path,
    is_url,
    remote_cache_root,
    requested_cap,
    shared_scheme,
)
from .writer import BuildOptions, build, build_to_url, normalize_fields

__all__ = ["build_store", "cached", "open_store", "verify_store"]


def open_store(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    share_with: str | int | None = None,
    max_bytes: int | None = None,
    prefetch: bool = False,
    local_copy: LocalCopy = "auto",
) -> CacheStore:
    """Open a store read-only, mapping its files (no data is read or copied).

    Parameters
    ----------
    path
        The store directory written by :func:`build_store`, or an fsspec URL
        of one (``s3://bucket/covers.tsc``, ``gs://...``; needs the
        ``remote`` extra). A remote store is opened lazily through the node
        cache ``<cache_dir>/remote/``: opening downloads its metadata and
        index only (checked against their recorded sizes and XXH3-128,
        published by one rename); each shard is downloaded the first time
        one of its rows is read (``store[p]``, ``take``, ``stack``, ``series``,
        a ``StoreDataset``), checked, published into the node cache by
        rename and mapped. ``take`` fetches the missing shards of a batch
        concurrently. Processes of the node (same user) asking for one shard
        at once download it once; a changed remote store gets a new version
        directory. ``file://`` URLs are local paths.
    cache_dir
        For URLs and network paths: the node cache (default
        ``$TSC_CACHE_DIR``, else ``~/.cache/tensorstore_cache``). It must be on
        a local disk: on a network filesystem it is refused with
        ``local_copy="always"`` and warned about otherwise.
    storage_options
        For URLs: options of the fsspec filesystem (credentials,
        ``endpoint_url``, ...).
    share_with
        For URLs: the node copy lies in a cache shared with this group (a
        name or a numeric gid; default ``$TSC_CACHE_GROUP``, else a private
        cache); see :func:`cached`.
    max_bytes
        Cap of the node cache's downloaded files, all stores together (also
        ``$TSC_CACHE_MAX_BYTES``; the smaller wins). Least recently used
        shards are evicted to make room, never one that a live process maps;
        if everything is mapped, the cache grows past the cap and says so
        once (:class:`CacheLimitWarning`). The cap is recorded in the cache:
        when processes ask for different caps the smallest wins and stays
        until ``<cache_dir>/remote/limit.json`` is deleted.
    prefetch
        Start fetching every shard in a background thread at once (see
        :meth:`CacheStore.prefetch`).
    local_copy
        For a store opened by path: ``"auto"`` (default) reads a store on a
        network filesystem (NFS, SMB/CIFS, Lustre, GPFS, BeeGFS, CephFS, a
        FUSE mount other than a known local one) through the node cache, so
        that no process maps a file that lives on the network (a memory map
        over a network mount pages over it and dies with ``SIGBUS`` when the
        server hiccups); ``"always"`` does so for any path; ``"never"`` maps
        the files in place.

    Returns
    -------
    CacheStore
        The open store.

    Raises
    ------
    StoreNotFoundError
        If there is no store at ``path``.
    CorruptStoreError
        If its metadata is invalid or its index files are damaged.
    UntrustedCacheError
        For URLs: if the node copy, or a directory above it, could have been
        written by someone the cache does not trust (see :func:`cached`).

    ValueError
        If an option is invalid (``local_copy="never"`` with a URL, a
        non-positive ``max_bytes``, a node cache on a network filesystem with
        ``local_copy="always"``).

    Warns
    -----
    StorePermissionWarning
        Once, if a directory or file of a store named by its path can be
        written by other users: opening it is your choice (like opening any
        file), but they could change what it returns.

    Examples
    --------
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> store = tsc.open_store("covers.tsc")  # in any process: maps, reads nothing
    >>> store.spec.item_shape, len(store)
    ((3, 32, 32), 8)
    >>> store[paths[0]].shape
    (3, 32, 32)

    A store in object storage is opened the same way, through the node cache:
    ``tsc.open_store("s3://bucket/covers.tsc", cache_dir="/nvme/tsc", max_bytes=50 << 30)``.
    """
    where = _resolve(path, cache_dir=cache_dir, storage_options=storage_options,
                     share_with=share_with, max_bytes=max_bytes, local_copy=local_copy)
    store = where.open()
    if prefetch:
        store.prefetch(background=True)
    return store


def _unused(given: dict[str, object], why: str) -> None:
    """Refuse the options of ``given`` that were passed (not None): they do not apply."""
    names = [name for name, value in given.items() if value is not None]
    if names:
        shown = ", ".join(repr(n) for n in names)
        raise TypeError(
            f"{shown} {'was' if len(names) == 1 else 'were'} provided but unused: {why}; "
            f"remove {'it' if len(names) == 1 else 'them'}"
        )


def _resolve(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None,
    storage_options: dict[str, Any] | None,
    share_with: str | int | None,
    max_bytes: int | None,
    local_copy: LocalCopy,
) -> Location:
    """Turn what ``open_store`` was given into the location of a store, once.

    A URL is a :class:`~tensorstore_cache.remote.copy.RemoteStore`; a cache
    namespace directory a :class:`~tensorstore_cache.cache.namespace.NamespaceDirectory`;
    a store directory a :class:`~tensorstore_cache.reader.assembly.StoreDirectory`,
    or a ``RemoteStore`` of a ``local://`` URL when it is read through the node
    cache. Options that do not apply to the route taken are refused.
    """
    check_mode("local_copy", local_copy, LocalCopy)
    requested_cap(max_bytes)  # checks the value and $TSC_CACHE_MAX_BYTES
    cache = None if cache_dir is None else os.fspath(cache_dir)
    if isinstance(path, str) and is_url(path):
        local = file_url_path(path)
        if local is None:
            if local_copy == "never":
                raise ValueError(
                    f"local_copy='never' cannot open {path!r}: a URL is read through the node "
                    "cache; pass local_copy='auto'"
                )
            _check_cache_local(cache_dir, local_copy)
            return RemoteStore(url=path, cache_dir=cache, storage_options=storage_options,
                               trust=resolve_trust(share_with), max_bytes=max_bytes)
        path = local
    root = Path(os.fspath(path))
    _unused({"storage_options": storage_options}, f"{str(root)!r} is a local path")
    if is_namespace(root):  # a directory of tensorstore_cache.cached(): all its live parts
        _unused({"cache_dir": cache_dir, "share_with": share_with, "max_bytes": max_bytes,
                 "local_copy": None if local_copy == "auto" else local_copy},
                f"{str(root)!r} is a cache namespace, opened where it lies")
        return NamespaceDirectory(str(root), Trust.explicit(root))
    if local_copy == "never":
        _unused({"cache_dir": cache_dir, "share_with": share_with, "max_bytes": max_bytes},
                "local_copy='never' maps the store's files in place, without the node cache")
    if local_copy == "always" or (local_copy == "auto" and _on_network(root)):
        if not root.is_dir():
            raise StoreNotFoundError(f"no store at {str(root)!r}")
        _check_cache_local(cache_dir, local_copy)
        return RemoteStore(url=f"local://{os.path.realpath(root)}", cache_dir=cache,
                           trust=resolve_trust(share_with), max_bytes=max_bytes)
    return StoreDirectory(str(root), Trust.explicit(root))


def _on_network(root: Path) -> bool:
    """Whether ``root`` lies on a network filesystem (False when unknown or missing)."""
    try:
        return os.path.exists(root) and network_mount(root) is not None
    except OSError:
        return False


def _check_cache_local(cache_dir: str | os.PathLike[str] | None, local_copy: LocalCopy) -> None:
    """Refuse (``"always"``) or warn about (otherwise) a node cache on a network filesystem."""
    where = remote_cache_root(cache_dir)
    probe = where
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        mount = network_mount(probe)
    except OSError:
        return
    if mount is None:
        return
    message = (
        f"the node cache {where} is on a network filesystem, {mount.describe()}: shards "
        "mapped from it page over the network; pass cache_dir= a directory on a local disk"
    )
    if local_copy == "always":
        raise ValueError(message)
    warn_once(("node cache on a network filesystem", str(where)), message, CacheLimitWarning,
              stacklevel=4)


def build_store(
    paths: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    size: tuple[int, int] | None = None,
    dtype: str = "float32",
    loader: Loader | BatchLoader | None = None,
    loader_id: str | None = None,
    workers: int | None = None,
    on_error: OnError = "raise",
    progress: bool = True,
    overwrite: bool = False,
    executor: Executor | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    share_with: str | int | None = None,
    shard_bytes: int = config.SHARD_BYTES,
    fields: Mapping[str, Field] | Sequence[str] | None = None,
    identity: Identity | None = None,
) -> CacheStore:
    """Build a store of one vector (or record) per distinct path, publish it atomically, open it.

    Parameters
    ----------
    paths
        Source paths: any iterable of ``str``/``os.PathLike`` (a list, a pandas
        Series, ...). Duplicates are stored once; rows follow first appearance.
    out
        The store directory to create, or an fsspec URL (``s3://bucket/covers.tsc``;
        needs the ``remote`` extra): each shard is then uploaded by the worker
        that wrote it, from a local temporary file, and the index and metadata
        by this process, the group ``zarr.json`` last (a failed build writes
        none, and deletes what it uploaded); the index stays in
        ``<cache_dir>/remote/`` as this node's copy. With ``overwrite=True``
        the old store is withdrawn from the URL when the build starts.
    size
        ``(height, width)`` of the built-in image loader (default ``(32, 32)``);
        ``TypeError`` with a custom ``loader``, which makes its own items.
    dtype
        Element type stored: ``"float32"`` (values of ``ToTensor``) or
        ``"uint8"`` (0..255, four times smaller; see :func:`to_float32`).
    loader
        Any callable ``path -> array`` of one fixed shape, used instead of the
        image loader. Each worker process receives it once, pickled with
        cloudpickle: by reference if it can be imported by name, by value
        otherwise (a function of ``__main__`` or of a notebook cell, a lambda,
        a closure, a :func:`functools.partial`). Without an ``item_shape``
        attribute, its first item is computed first, here, to learn the shape.
        A :class:`BatchLoader` computes batches in device workers instead (its
        ``batch_size``, ``prepare`` and ``devices``); ``executor`` does not
        apply to it.
    loader_id
        A string naming the loader and its version, recorded in the spec
        (default: the loader's ``loader_id`` attribute, else its module and
        qualified name).
    workers
        Processes that build (default: every core): this one and a pool of
        ``workers - 1``, forked from this one where that is safe (no other
        thread runs here; ``TSC_WORKER_START=spawn`` turns it off), else started
        from a clean interpreter; neither runs ``__main__`` again. ``1`` builds in this process, as does a daemonic
        process (a DataLoader or multiprocessing pool worker), with a notice.
    on_error
        ``"raise"`` (default): if any source fails, raise :class:`BuildError`
        listing every failure and publish nothing. ``"skip"``: build the rest
        and record the skipped paths in ``spec.skipped``.
    progress
        Show a progress bar with items/s.
    overwrite
        Replace an existing store at ``out``.
    executor
        A :class:`concurrent.futures.Executor` to run the shard tasks on
        instead of a local process pool (e.g. ``dask.distributed.Client(...)
        .get_executor()``); every task writes one whole shard into the build
        directory next to ``out``, which must be on a filesystem all workers
        share, or, for a URL ``out``, uploads it there. Tasks may be retried (a killed worker): a shard is written to a
        hidden temporary file and renamed, so a retry replaces it safely. Pass
        ``workers=`` the cluster's thread count so that there are enough shards.
    cache_dir
        For a URL ``out``: the local cache directory (default
        ``$TSC_CACHE_DIR``, else ``~/.cache/tensorstore_cache``).
    storage_options
        For a URL ``out``: options of the fsspec filesystem.
    share_with
        For a URL ``out``: the local copy lies in a cache shared with this
        group (default ``$TSC_CACHE_GROUP``, else private); see :func:`cached`.
        A store at a path you name gets your umask's modes.
    shard_bytes
        Target size of one shard file (default 32 MiB). A store read from
        object storage is fetched shard by shard, so smaller shards fetch
        less for a few rows and larger ones make fewer requests. Rows per
        shard are rounded down to keep every shard a whole number of memory
        pages.
    fields
        The fields of a store of records; see :func:`cached`.
    identity
        What is recorded about each source: ``"stat"`` (default), ``"none"``
        or a function of the keys giving version tokens; see :func:`cached`.

    Returns
    -------
    CacheStore
        The published store, open.

    Raises
    ------
    BuildError
        If sources failed and ``on_error="raise"``.
    StoreExistsError
        If ``out`` exists and ``overwrite`` is false.
    ReentrantBuildError
        If called, for ``out``, by the loader of the build of ``out`` or by one
        of that build's worker processes.
    TypeError
        If ``workers > 1`` and the loader cannot be pickled, or ``size`` is given
        with a custom loader.

    Examples
    --------
    >>> store = tsc.build_store(paths, "covers.tsc", size=(32, 32), progress=False)
    >>> store[paths[0]].shape, store.spec.dtype
    ((3, 32, 32), 'float32')
    >>> u8 = tsc.build_store(paths, "covers-u8.tsc", dtype="uint8", progress=False)
    >>> np.array_equal(tsc.to_float32(u8.stack(paths)), store.stack(paths))
    True
    """
    check_mode("on_error", on_error, OnError)
    if type(shard_bytes) is not int or shard_bytes < 1:
        raise ValueError(f"shard_bytes must be a positive number of bytes, got {shard_bytes!r}")
    out, url = _build_target(out, overwrite=overwrite, cache_dir=cache_dir,
                             storage_options=storage_options, share_with=share_with)
    np_dtype = np.dtype(dtype).name
    schema, names = normalize_fields(fields)
    kind, token_fn = resolve_identity(identity)
    if kind == "content":
        raise ValueError(
            "identity='content' is kept by cached(), whose parts record content hashes beside "
            "them; a store at a path you name records each source's stat (identity='stat'), "
            "nothing ('none') or version tokens (a function)"
        )
    keys = list(dict.fromkeys(normalize_keys(paths)))
    batching = _batching(loader, executor)
    options = BuildOptions(
        **batching,
        loader=resolve_loader(loader, loader_id=loader_id, size=size, dtype=np_dtype),
        dtype=np_dtype,
        workers=workers,
        on_error=on_error,
        progress=progress,
        overwrite=overwrite,
        executor=executor,
        shard_bytes=shard_bytes,
        schema=schema,
        names=names,
        identity=kind,
        tokens=None if token_fn is None else token_map(keys, token_fn),
    )
    if url is None:
        target = Path(os.fspath(out))
        build(keys, target, options)
        return open_directory(target)
    trust = resolve_trust(share_with)
    build_to_url(keys, url, dataclasses.replace(options, trust=trust), cache_dir=cache_dir,
                 storage_options=storage_options)
    return RemoteStore(url=url, cache_dir=None if cache_dir is None else os.fspath(cache_dir),
                       storage_options=storage_options, trust=trust).open()


def _build_target(
    out: str | os.PathLike[str],
    *,
    overwrite: bool,
    cache_dir: str | os.PathLike[str] | None,
    storage_options: dict[str, Any] | None,
    share_with: str | int | None,
) -> tuple[str | os.PathLike[str], str | None]:
    """Where :func:`build_store` writes: ``(out, None)`` for a path (a ``file://`` URL made
    one), ``(out, url)`` for a URL, checked; options that do not apply are refused."""
    url = out if isinstance(out, str) and is_url(out) else None
    if url is not None:
        local = file_url_path(url)
        if local is None:
            check_target(url, overwrite=overwrite, storage_options=storage_options)
            return out, url
        out = local
    _unused({"storage_options": storage_options, "share_with": share_with,
             "cache_dir": cache_dir},
            f"{os.fspath(out)!r} is a local path: the store is written there, with your "
            "umask's modes, and no node cache is involved")
    return out, None


def cached(
    paths: Iterable[str | os.PathLike[str]],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    size: tuple[int, int] | None = None,
    dtype: str = "float32",
    loader: Loader | BatchLoader | None = None,
    loader_id: str | None = None,
    workers: int | None = None,
    on_error: OnError = "raise",
    progress: bool = True,
    on_stale: OnStale = "rebuild",
    lock_timeout: float | None = None,
    executor: Executor | None = None,
    share_with: str | int | None = None,
    fields: Mapping[str, Field] | Sequence[str] | None = None,
    identity: Identity | None = None,
    remote: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> CacheStore:
    """Return a store holding the vector of every path, computing only what is missing.

    Vectors live in a *namespace* of ``cache_dir`` named by a fingerprint of
    everything that determines them (loader id and parameters, dtype, format
    version), so different transforms never see each other's vectors. Paths
    already cached and unchanged are opened, not recomputed; missing and
    stale ones are computed once, by one process, while concurrent callers
    wait for it and then open its result.

    Parameters
    ----------
    paths
        Source paths (a list, a pandas Series, ...); order and duplicates do
        not matter.
    cache_dir
        Root of the cache (default ``$TSC_CACHE_DIR``, else
        ``~/.cache/tensorstore_cache``).
    size
        Output ``(height, width)`` of the built-in image loader (default
        ``(32, 32)``); ``TypeError`` with a custom ``loader``.
    dtype
        Element type of the built-in image loader's output, and the stored
        type of a custom loader's output.
    loader
        A callable ``path -> array`` of one fixed shape, instead of the image
        loader: a function, lambda, closure, ``functools.partial`` or
        callable object, defined anywhere (a script's ``__main__``, a notebook
        cell); see :func:`build_store`. A ``params`` dict attribute becomes
        part of the fingerprint. A :class:`BatchLoader` computes batches in
        device workers instead (its ``batch_size``, ``prepare`` and
        ``devices``); its ``loader_id`` names what ``prepare`` and the
        loader compute together.
    loader_id
        A name for what a custom ``loader`` computes, changed whenever its
        output changes, e.g. ``"myproject.thumbnails/2"``; it wins over the
        loader's ``loader_id`` attribute. Without either, the loader is named
        by what it computes, ``auto:<qualname>/<digest>`` (see
        :func:`loader_fingerprint`): an edit to it, its helpers or the values
        it reads gets a new namespace. Prefer an explicit id for caches shared
        for a long time or across Python upgrades (the bytecode is part of
        the fingerprint), and for loaders that hold what cannot be
        fingerprinted (refused with :class:`UnnamedLoaderError`).
    workers
        Processes for a build (default: every core); see :func:`build_store`.
    executor
        A :class:`concurrent.futures.Executor` that runs the build's shard
        tasks instead of a local process pool (e.g. a Dask client's
        ``get_executor()``). With ``remote``, the tasks of a build for the
        cluster upload their shards straight into the remote part from
        wherever they run, so ``cache_dir`` may stay local to each machine;
        otherwise (and for what a node builds for itself only, in read mode
        or for sources whose bytes differ on it) they write into
        ``cache_dir``, which must then be on a filesystem every worker
        shares. See :func:`build_store`.
    on_error
        ``"raise"``: a source that fails to load fails the call and nothing
        is published. ``"skip"``: the rest is published; skipped sources are
        listed in ``store.spec.skipped`` and retried by the next call.
    progress
        Show build progress, and say on stderr whom this call waits for.
    identity
        How a cached entry is known to be current: ``"stat"`` (default: the
        source's size and mtime are those recorded before it was read),
        ``"content"`` (its content hash is; reads every source, and records
        hashes of what it builds), ``"none"`` (never stale, and no system call
        on a key: keys need not be files, e.g. product ids or URLs), or a
        function ``keys -> uint64 array`` of version tokens (an ETag, a
        database ``updated_at``), called once per call with the requested
        keys, whose changed tokens make their entries stale. Entries recorded
        under another kind are stale once. Under ``"stat"`` a key that is not a
        file fails its build, saying to pass ``"none"`` or a function.
    fields
        The fields of a store of records: a mapping of field name to
        :class:`Fixed`, :class:`Ragged` or :class:`Text`, declaring them (each
        record is checked against them), or the field names of a loader that
        returns tuples, in order. None (default): one tensor per key, unless
        the loader returns records (a dict, or a tuple with names), whose
        fields are then inferred from the first. Part of the fingerprint.
    on_stale
        What to do with stale entries: ``"rebuild"`` (recompute them into a
        new part that overrides the old entries), ``"raise"``
        (:class:`StaleSourceError` listing them) or ``"ignore"`` (use them;
        also skips the check).
    lock_timeout
        Seconds to wait at most for another process's build
        (:class:`StoreLockedError` afterwards); ``None`` waits as long as it runs.
    share_with
        Share the cache with the members of this group (a group name or a
        numeric gid; default ``$TSC_CACHE_GROUP``, else a private cache).
        Private: only what you or root own and nobody else can write is read,
        and directories are created ``0o700``, files ``0o600``. Shared: what
        any member of the group owns is read (group-owned, not
        world-writable), directories are created group-owned, setgid
        ``0o2770``, files ``0o640`` (``0o660`` for lock files and
        ``last_used``), and each item is computed once for all members.
        Every member must pass the same group.
    remote
        Share the namespace with other machines (default ``$TSC_REMOTE``,
        else none): an fsspec URL of a prefix on a store that supports
        create-only writes (``s3://bucket/prefix``; S3, MinIO, R2, ...) or a
        directory every machine mounts (NFS, Lustre). Each item is then
        computed once in the whole cluster: the node whose call needs it
        first holds a lease, builds, uploads one object per part and commits
        a numbered manifest by a create-only write; the others wait and
        fetch. ``cache_dir`` is this node's copy. See "One cache for a
        cluster" in the documentation.
    storage_options
        With ``remote``: options of the fsspec filesystem (credentials,
        ``endpoint_url``, ...), as :func:`open_store` takes them.

    Returns
    -------
    CacheStore
        Holds every requested path (except skipped ones) and possibly more.

    Raises
    ------
    BuildError
        If sources failed to load and ``on_error="raise"``.
    StaleSourceError
        If entries are stale and ``on_stale="raise"``.
    ReentrantBuildError
        If called, for this cache, by the loader of its build or by one of
        that build's worker processes (instead of waiting for ever for the
        build's own lock).
    UntrustedCacheError
        If a directory or file of the cache is owned by someone else or
        writable by others (or, shared, by a non-member), before anything in
        it is read; the message names the path, its owner and mode, and the fix.
    UnnamedLoaderError
        If a custom loader without a ``loader_id`` holds something that has no
        content to name it by (an open file, a random generator, ...): the
        message gives the path to it.
    ValueError
        If an option is invalid (a ``loader_id``, argument or attribute, that
        is empty or starts with ``auto:``), or ``share_with`` names no group.
    TypeError
        If ``size`` is given with a custom loader, ``executor`` with a
        :class:`BatchLoader`, or a ``loader_id`` that is not a string.
    PermissionError
        If you are not a member of the ``share_with`` group.
    UnsafeRemoteError
        If ``remote`` ignores create-only writes (probed once per node cache).

    Examples
    --------
    >>> store = tsc.cached(paths[:5], size=(32, 32), progress=False)  # builds 5
    >>> store = tsc.cached(paths, size=(32, 32), progress=False)      # builds the 3 new ones
    >>> batch = store.take(store.rows(paths))
    >>> batch.shape, tsc.list_caches()[0].parts
    ((8, 3, 32, 32), 2)
    """
    check_mode("on_error", on_error, OnError)
    kind, tokens = resolve_identity(identity)
    check_mode("on_stale", on_stale, OnStale)
    np_dtype = np.dtype(dtype).name
    schema, names = normalize_fields(fields)
    batching = _batching(loader, executor)
    named = None  # a custom loader without an id is named by what it computes
    own_id = getattr(loader, "loader_id", None) if loader is not None else None
    if loader_id is not None:
        check_loader_id(loader_id)
    elif own_id is not None:
        check_loader_id(own_id, attribute=True)
    elif loader is not None:
        named = loader_fingerprint(loader)  # a BatchLoader's prepare is its own attribute
    build_options = BuildOptions(
        **batching,
        loader=resolve_loader(loader, loader_id=named.loader_id if named else loader_id,
                              size=size, dtype=np_dtype, strict=True),
        dtype=np_dtype,
        workers=workers,
        on_error=on_error,
        progress=progress,
        executor=executor,
        trust=resolve_trust(share_with),
        schema=schema,
        names=names,
    )
    root = config.cache_root(cache_dir)
    keys = list(dict.fromkeys(normalize_keys(paths)))
    options = CacheOptions(
        build=build_options, identity=kind, tokens=tokens, on_stale=on_stale,
        lock_timeout=lock_timeout, named=named,
        remote=_remote(remote, storage_options),
    )
    return cached_store(root, keys, options)


def _remote(
    remote: str | os.PathLike[str] | None, storage_options: dict[str, Any] | None
) -> RemoteOptions | None:
    """The ``remote=`` of :func:`cached` (else ``$TSC_REMOTE``), checked."""
    where = os.fspath(remote) if remote is not None else os.environ.get(config.REMOTE_ENV, "")
    if not where.strip():
        if storage_options is not None:
            raise ValueError("storage_options= is given without remote= (or $TSC_REMOTE)")
        return None
    if is_url(where):
        shared_scheme(where)  # a store without create-only writes is refused here
    elif not os.path.isdir(where):
        raise ValueError(f"remote={where!r} is neither a URL nor an existing directory; give "
                         "s3://, gs:// or az:// with a bucket and prefix, or a directory every "
                         "machine mounts")
    return RemoteOptions(url=where, storage_options=storage_options)


def _batching(loader: Loader | BatchLoader | None, executor: Executor | None) -> dict[str, Any]:
    """The batch options of a build, read from a :class:`BatchLoader` and checked: none for a
    loader of one key.

    Raises
    ------
    TypeError
        If ``executor`` is given with a batch loader, or its ``prepare`` is not callable
        or its ``devices`` a string.
    ValueError
        If its ``batch_size`` is not positive or its ``devices`` is empty.
    """
    if not isinstance(loader, BatchLoader):
        return {}
    if executor is not None:
        raise TypeError(
            "executor= runs shard tasks anywhere, but a BatchLoader's device workers run on "
            "this machine; remove executor= (workers= sets the CPU processes that prepare)"
        )
    size, prepare, devices = loader.batch_size, loader.prepare, loader.devices
    if type(size) is not int or size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {size!r}")
    if prepare is not None and not callable(prepare):
        raise TypeError(f"prepare must be a callable key -> item, got {prepare!r}")
    if isinstance(devices, str):
        raise TypeError(f"devices must be a list of device names, e.g. [{devices!r}]")
    names = list(devices)
    if not names or not all(isinstance(d, str) and d for d in names):
        raise ValueError(
            f"devices must name at least one device (e.g. ['cpu'], ['cuda:0', 'cuda:1']), "
            f"got {devices!r}"
        )
    return {"batch_size": size, "prepare": prepare, "devices": tuple(dict.fromkeys(names))}


def verify_store(target: CacheStore | str | os.PathLike[str]) -> VerifyReport:
    """Check every file of a store against the sizes and checksums recorded at build time.

    Parameters
    ----------
    target
        An open :class:`CacheStore` (each of its segments is checked) or a
        store directory.

    Returns
    -------
    VerifyReport
        The combined report; ``report.ok`` is true for a sound store and
        :meth:`VerifyReport.raise_if_bad` turns problems into a
        :class:`CorruptStoreError` naming every bad file.

    Raises
    ------
    StoreNotFoundError
        If there is no store at ``target``.

    Examples
    --------
    >>> _ = tsc.build_store(paths, "covers.tsc", progress=False)
    >>> report = tsc.verify_store("covers.tsc")
    >>> report.ok, report.files_checked
    (True, 14)
    """
    if isinstance(target, CacheStore):
        return target.report()
    path = Path(os.fspath(target))
    if (path / GROUP).is_file() or (path / GROUP).is_symlink():
        report = VerifyReport(str(path))
        report.extend(verify_segment(path))
        if report.ok:  # the files are sound: check the offsets of ragged fields too
            with open_directory(path) as store:
                report.problems.extend(store.report().problems)
        return report
    try:  # a layout of several segments, or no store: let open_store decide
        with open_store(path) as store:
            return verify_store(store)
    except CorruptStoreError as exc:
        report = VerifyReport(str(path))
        report.problems.append(Problem(exc.path or str(path), "metadata", str(exc)))
        return report
