""":func:`cached`: get or build, shared by every process that asks for the same vectors.

One call returns a store holding every requested path. What is already
cached is opened; only missing or stale sources are computed, once, by one
process (the others wait on the namespace's build lock, then open its
result), into a new immutable part published next to the old ones.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ._build import build_store, collect_debris
from ._compact import merge_start, write_merged
from ._errors import BuildError, StaleSourceError, StoreNotFoundError
from ._keys import normalize_keys
from ._loader import ImageLoader
from ._lock import Holder
from ._namespace import (
    Manifest,
    Namespace,
    default_cache_dir,
    fingerprint,
    namespace_name,
    open_parts,
)
from ._reentry import building
from ._stale import CHECKS, hash_many, stale_mask, write_hashes
from ._store import CacheStore

__all__ = ["cached"]

logger = logging.getLogger("tensorstore_cache")

Loader = Callable[[str], Any]
_ON_STALE = ("rebuild", "raise", "ignore")
_BUILD_MARK = ".tsc-build-"


@dataclass(frozen=True, slots=True)
class PartLoader:
    """A namespace's loader with the item shape and parameters the namespace records.

    Declaring ``item_shape`` (the namespace's, once known) spares the
    builder from learning it from a first item.
    """

    fn: Loader
    item_shape: tuple[int, ...] | None
    params: dict[str, Any]

    def __call__(self, key: str) -> Any:
        return self.fn(key)


def _resolve(
    loader: Loader | None, loader_id: str | None, size: tuple[int, int], dtype: str
) -> tuple[Loader, str, dict[str, Any], tuple[int, ...] | None]:
    if loader is None:
        if loader_id is not None:
            raise ValueError(
                "loader_id names a custom loader; without loader= the built-in image loader "
                f"is used and identifies itself - drop loader_id={loader_id!r} or pass loader="
            )
        image = ImageLoader(size=size, dtype=dtype)
        return image, image.loader_id, dict(image.params), image.item_shape
    if not callable(loader):
        raise TypeError(f"loader must be a callable path -> array, got {loader!r}")
    ident = loader_id if loader_id is not None else getattr(loader, "loader_id", None)
    if not isinstance(ident, str) or not ident.strip():
        name = getattr(loader, "__qualname__", type(loader).__qualname__)
        raise ValueError(
            f"cached() needs a loader_id for the custom loader {name!r}: the cache keeps the "
            "vectors of each transform apart by this name, and cannot derive one from code. "
            "Pass loader_id='myproject.thumbnails/1' (change it whenever the loader's output "
            "changes), and give the loader a `params` dict if it has parameters; or give the "
            "loader a `loader_id` attribute"
        )
    params = getattr(loader, "params", None) or {}
    if not isinstance(params, dict):
        raise TypeError(f"the loader's params must be a dict of JSON values, got {params!r}")
    shape = getattr(loader, "item_shape", None)
    return loader, ident, dict(params), None if shape is None else tuple(int(d) for d in shape)


def _reporter(ns: Namespace, progress: bool) -> Callable[[Holder | None], None]:
    def report(holder: Holder | None) -> None:
        who = holder.describe() if holder is not None else "another process"
        msg = (
            f"tensorstore_cache: waiting for {who}, which holds the build lock of "
            f"{ns.root.name}; its results will be reused"
        )
        logger.info(msg)
        if progress:
            print(msg, file=sys.stderr, flush=True)

    return report


def _plan(
    view: CacheStore | None, keys: list[str], check: str, on_stale: str
) -> tuple[list[str], list[str]]:
    """Return ``(missing, stale)`` keys of ``keys`` against ``view``."""
    if view is None or not keys:
        return list(keys), []
    rows = view.rows(keys, missing="ignore")
    present = np.flatnonzero(rows >= 0)
    missing = [keys[i] for i in np.flatnonzero(rows < 0).tolist()]
    if on_stale == "ignore" or len(present) == 0:
        return missing, []
    found = [keys[i] for i in present.tolist()]
    mask = stale_mask(view, found, rows[present], check=check)
    return missing, [found[i] for i in np.flatnonzero(mask).tolist()]


def _open(ns: Namespace, manifest: Manifest | None, *, pin: bool) -> CacheStore | None:
    if manifest is None or not manifest.parts:
        return None
    return open_parts(str(ns.root), manifest.parts, pin=pin)


def _empty(ns: Namespace, item_shape: tuple[int, ...] | None) -> CacheStore:
    store = open_parts(str(ns.root), [], pin=False)
    if item_shape is not None:
        store = CacheStore([], replace(store.spec, item_shape=item_shape), str(ns.root))
    return store


def cached(
    paths: Iterable[str | os.PathLike[str]],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    size: tuple[int, int] = (32, 32),
    dtype: str = "float32",
    loader: Loader | None = None,
    loader_id: str | None = None,
    workers: int | None = None,
    on_error: str = "raise",
    progress: bool = True,
    check: str = "stat",
    on_stale: str = "rebuild",
    lock_timeout: float | None = None,
    executor: Executor | None = None,
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
    size, dtype
        Output ``(height, width)`` and element type of the built-in image
        loader (``dtype`` is also the stored type of a custom loader's output).
    loader
        A callable ``path -> array`` of one fixed shape, instead of the image
        loader: a function, lambda, closure, ``functools.partial`` or
        callable object, defined anywhere (a script's ``__main__``, a notebook
        cell); see :func:`build_store`. A ``params`` dict attribute becomes
        part of the fingerprint.
    loader_id
        Required with a custom ``loader`` (unless it has a ``loader_id``
        attribute): a name for what it computes, changed whenever its output
        changes, e.g. ``"myproject.thumbnails/2"``.
    workers
        Processes for a build (default: every core); see :func:`build_store`.
    executor
        A :class:`concurrent.futures.Executor` that runs the build's shard
        tasks instead of a local process pool (e.g. a Dask client's
        ``get_executor()``); ``cache_dir`` must then be on a filesystem every
        worker shares. See :func:`build_store`.
    on_error
        ``"raise"``: a source that fails to load fails the call and nothing
        is published. ``"skip"``: the rest is published; skipped sources are
        listed in ``store.spec.skipped`` and retried by the next call.
    progress
        Show build progress, and say on stderr whom this call waits for.
    check
        How a cached entry is known to be current: ``"stat"`` (the source's
        size and mtime are those recorded when it was computed) or ``"hash"``
        (its content hash is; reads every source, and records hashes of what
        it builds).
    on_stale
        What to do with stale entries: ``"rebuild"`` (recompute them into a
        new part that overrides the old entries), ``"raise"``
        (:class:`StaleSourceError` listing them) or ``"ignore"`` (use them;
        also skips the check).
    lock_timeout
        Seconds to wait at most for another process's build
        (:class:`StoreLockedError` afterwards); ``None`` waits as long as it runs.

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
    ValueError
        If a custom loader has no ``loader_id``, or an option is invalid.
    ReentrantBuildError
        If called, for this cache, by the loader of its build or by one of
        that build's worker processes (instead of waiting for ever for the
        build's own lock).

    Examples
    --------
    >>> store = cached(df["img_path"], size=(32, 32))   # doctest: +SKIP
    >>> batch = store.take(store.rows(df["img_path"]))  # doctest: +SKIP
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    if on_stale not in _ON_STALE:
        raise ValueError(f"on_stale must be one of {_ON_STALE}, got {on_stale!r}")
    np_dtype = np.dtype(dtype).name
    fn, ident, params, item_shape = _resolve(loader, loader_id, size, np_dtype)
    fp = fingerprint(ident, params, np_dtype)
    root = Path(os.fspath(cache_dir)) if cache_dir is not None else default_cache_dir()
    ns = Namespace(root.expanduser() / namespace_name(fp), fp)
    keys = list(dict.fromkeys(normalize_keys(paths)))
    build = _Build(fn, ident, params, item_shape, np_dtype, workers, on_error, progress, check,
                   on_stale, lock_timeout, executor)
    for attempt in range(3):
        try:
            return _get_or_build(ns, keys, build)
        except StoreNotFoundError:
            if attempt == 2:
                raise
            # gc removed the namespace (or a part) while we opened it: start afresh
            logger.info("%s was collected while in use; retrying", ns.root.name)
    raise AssertionError("unreachable")


@dataclass(slots=True)
class _Build:
    """How to compute what is missing (the options of one cached() call)."""

    fn: Loader
    ident: str
    params: dict[str, Any]
    item_shape: tuple[int, ...] | None
    dtype: str
    workers: int | None
    on_error: str
    progress: bool
    check: str
    on_stale: str
    lock_timeout: float | None
    executor: Executor | None


def _get_or_build(ns: Namespace, keys: list[str], b: _Build) -> CacheStore:
    ns.ensure()
    ns.touch()
    check, on_stale, item_shape = b.check, b.on_stale, b.item_shape

    # Most calls end here, without any lock: everything is cached and current.
    view = _open(ns, ns.current(), pin=True)
    missing, stale = _plan(view, keys, check, on_stale)
    if not missing and not stale:
        return view if view is not None else _empty(ns, item_shape)
    if view is not None:
        view.close()
    if stale and on_stale == "raise":
        raise StaleSourceError(stale)
    todo = missing + stale

    # A worker of this namespace's own build (or its loader) fails here instead of waiting
    # for the lock its builder holds.
    with building(ns.root):
        lock = ns.lock()
        lock.acquire(timeout=b.lock_timeout, on_wait=_reporter(ns, b.progress))  # False: no locks
        try:
            # Re-check under the lock: the previous holder may have built what we need.
            base = ns.current()
            view = _open(ns, base, pin=False)
            try:
                missing, stale = _plan(view, todo, check, on_stale)
                if stale and on_stale == "raise":
                    raise StaleSourceError(stale)
                todo = missing + stale
                if view is not None:
                    held = view.spec.item_shape
                    if item_shape is not None and tuple(item_shape) != held:
                        raise ValueError(
                            f"the loader declares items of shape {tuple(item_shape)}, but the cache "
                            f"{str(ns.root)!r} holds items of shape {held} made by {b.ident!r}; "
                            "if the loader's output changed, give it a new loader_id"
                        )
                    item_shape = held
            finally:
                if view is not None:
                    view.close()
            if todo:
                _sweep_debris(ns)
                if stale:
                    logger.info("recomputing %d stale entries of %s", len(stale), ns.root.name)
                part = _build_part(ns, todo, b.fn, b.ident, b.params, item_shape, b.dtype, b.workers,
                                   b.on_error, b.progress, check, b.executor)
                if part is not None:
                    manifest = _publish_part(ns, part, todo)
                    if manifest is not None:
                        _maybe_compact(ns, manifest)
        finally:
            lock.release()
    final = _open(ns, ns.current(), pin=True)
    return final if final is not None else _empty(ns, item_shape)


def _sweep_debris(ns: Namespace) -> None:
    """Remove temporary directories that dead builders of this host left in ``parts/``."""
    try:
        names = os.listdir(ns.parts_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(".") and _BUILD_MARK in name:
            collect_debris(ns.parts_dir / name[1 : name.index(_BUILD_MARK)])


def _build_part(
    ns: Namespace,
    todo: list[str],
    fn: Loader,
    ident: str,
    params: dict[str, Any],
    item_shape: tuple[int, ...] | None,
    dtype: str,
    workers: int | None,
    on_error: str,
    progress: bool,
    check: str,
    executor: Executor | None = None,
) -> str | None:
    """Build ``todo`` into a new part; return its id, or None if nothing was built."""
    part = ns.new_part_id()
    target = ns.part_dir(part)
    hashes = hash_many(todo) if check == "hash" else None  # before loading: errs on the safe side
    if isinstance(fn, ImageLoader):
        use: Loader = fn
    else:
        use = PartLoader(fn, item_shape, params)
    try:
        store = build_store(
            todo, target, dtype=dtype, loader=use, loader_id=ident, workers=workers,
            on_error=on_error, progress=progress, executor=executor,
        )
    except BuildError as exc:
        if item_shape is not None and any("must have shape" in r for _p, r in exc.failures):
            exc.add_note(
                f"the cache {ns.root.name} holds items of shape {item_shape} made by "
                f"{ident!r}; if the loader's output changed, give it a new loader_id"
            )
        raise
    try:
        n = len(store)
        built = store.paths if hashes is not None else []
    finally:
        store.close()
    if n == 0:  # everything was skipped; never referenced, so nobody maps it
        shutil.rmtree(target, ignore_errors=True)
        return None
    if hashes is not None:
        by_key = dict(zip(todo, hashes.tolist(), strict=True))
        write_hashes(target, np.array([by_key[k] for k in built], np.uint64))
    return part


def _publish_part(ns: Namespace, part: str, keys: list[str]) -> Manifest | None:
    """Add ``part`` to the current manifest; return the manifest published (None if adopted)."""
    for attempt in range(1000):
        base = ns.current()
        view = _open(ns, base, pin=False)
        try:
            rows = view.rows(keys, missing="ignore") if view is not None else np.full(len(keys), -1)
            if attempt and view is not None and bool(np.all(rows >= 0)):
                # Another writer published first (no working lock here) and its result
                # holds every key we built: adopt it; our part was never referenced.
                shutil.rmtree(ns.part_dir(part), ignore_errors=True)
                return None
            entries = (len(view) if view is not None else 0) + int(np.sum(rows < 0))
            shape = view.spec.item_shape if view is not None else None
        finally:
            if view is not None:
                view.close()
        parts = [*(base.parts if base is not None else ()), part]
        if shape is None:
            with open_parts(str(ns.root), [part], pin=False) as own:
                shape = own.spec.item_shape
        published = ns.publish(
            parts, base=base.generation if base is not None else 0, entries=entries, item_shape=shape
        )
        if published is not None:
            return published
        logger.info("another process published %s first; merging with its result", ns.root.name)
    raise RuntimeError(f"could not publish a manifest in {str(ns.root)!r} after 1000 attempts")


def _maybe_compact(ns: Namespace, manifest: Manifest) -> None:
    """Merge parts when there are too many or too many overridden rows."""
    view = _open(ns, manifest, pin=False)
    if view is None:
        return
    try:
        segments = view._segments
        dead = view._overlay.dead_rows if view._overlay is not None else 0
        start = merge_start([seg.n for seg in segments], dead)
        if start is None:
            return
        sub = CacheStore(segments[start:], view.spec, view.location)
        part = ns.new_part_id()
        logger.info("merging %d parts of %s into %s", len(segments) - start, ns.root.name, part)
        write_merged(sub, ns.part_dir(part))
    finally:
        view.close()
    published = ns.publish(
        [*manifest.parts[:start], part],
        base=manifest.generation,
        entries=manifest.entries,
        item_shape=manifest.item_shape,
    )
    if published is None:  # someone published meanwhile (no working lock): drop ours
        shutil.rmtree(ns.part_dir(part), ignore_errors=True)
