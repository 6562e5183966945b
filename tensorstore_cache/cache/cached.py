"""Get or build, shared by every process that asks for the same vectors.

One call returns a store holding every requested path. What is already
cached is opened; only missing or stale sources are computed, once, by one
process (the others wait on the namespace's build lock, then open its
result), into a new immutable part published next to the old ones.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import Check, OnStale
from ..errors import BuildError, StaleSourceError, StoreNotFoundError
from ..format.hashes import write_hashes
from ..fs.locks import Holder
from ..fs.temp import remove_tree
from ..reader.sources import hash_many, stale_mask
from ..reader.store import CacheStore, open_directory
from ..writer.build import BuildOptions, build, build_dir_target, collect_debris
from ..writer.reentry import building
from .compact import merge_start, write_merged
from .fingerprint import fingerprint, namespace_name
from .namespace import Manifest, Namespace, open_parts

__all__ = ["CacheOptions", "cached_store"]

logger = logging.getLogger("tensorstore_cache")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheOptions:
    """The options of one :func:`~tensorstore_cache.cached` call."""

    build: BuildOptions
    """How to compute what is missing."""
    check: Check = "stat"
    """How a cached entry is known to be current."""
    on_stale: OnStale = "rebuild"
    """What to do with stale entries."""
    lock_timeout: float | None = None
    """Seconds to wait at most for another process's build."""


def cached_store(cache_dir: Path, keys: list[str], options: CacheOptions) -> CacheStore:
    """Return a store of the namespace of ``options``'s loader holding every key of ``keys``.

    Parameters
    ----------
    cache_dir
        The cache directory.
    keys
        Distinct normalised keys.
    options
        What to compute and how.
    """
    info = options.build.loader
    fp = fingerprint(info.loader_id, info.params, options.build.dtype)
    ns = Namespace(cache_dir.expanduser() / namespace_name(fp), fp)
    for attempt in range(3):
        try:
            return _get_or_build(ns, keys, options)
        except StoreNotFoundError:
            if attempt == 2:
                raise
            # gc removed the namespace (or a part) while we opened it: start afresh
            logger.info("%s was collected while in use; retrying", ns.root.name)
    raise AssertionError("unreachable")


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
    view: CacheStore | None, keys: list[str], check: Check, on_stale: OnStale
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
    mask = stale_mask(found, view.source_identity(rows[present], content_hash=check == "hash"))
    return missing, [found[i] for i in np.flatnonzero(mask).tolist()]


def _open(ns: Namespace, manifest: Manifest | None, *, pin: bool) -> CacheStore | None:
    if manifest is None or not manifest.parts:
        return None
    return open_parts(str(ns.root), manifest.parts, pin=pin)


def _empty(ns: Namespace, item_shape: tuple[int, ...] | None) -> CacheStore:
    store = open_parts(str(ns.root), [], pin=False)
    if item_shape is not None:
        spec = dataclasses.replace(store.spec, item_shape=item_shape)
        store = CacheStore([], spec, str(ns.root))
    return store


def _get_or_build(ns: Namespace, keys: list[str], options: CacheOptions) -> CacheStore:
    ns.ensure()
    ns.touch()
    check, on_stale = options.check, options.on_stale
    item_shape = options.build.loader.item_shape

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
        lock.acquire(  # False: no locks here
            timeout=options.lock_timeout, on_wait=_reporter(ns, options.build.progress)
        )
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
                            f"{str(ns.root)!r} holds items of shape {held} made by "
                            f"{options.build.loader.loader_id!r}; "
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
                part = _build_part(ns, todo, options, item_shape)
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
        target = build_dir_target(name)
        if target is not None:
            collect_debris(ns.parts_dir / target)


def _build_part(
    ns: Namespace, todo: list[str], options: CacheOptions, item_shape: tuple[int, ...] | None
) -> str | None:
    """Build ``todo`` into a new part; return its id, or None if nothing was built.

    ``item_shape`` (the namespace's, else the loader's) spares the builder a
    probing call of the loader, so every item is computed exactly once.
    """
    part = ns.new_part_id()
    target = ns.part_dir(part)
    hashes = hash_many(todo) if options.check == "hash" else None  # before loading: errs on the safe side
    loader = dataclasses.replace(options.build.loader, item_shape=item_shape)
    try:
        build(todo, target, dataclasses.replace(options.build, loader=loader, overwrite=False))
    except BuildError as exc:
        if item_shape is not None and any("must have shape" in r for _p, r in exc.failures):
            exc.add_note(
                f"the cache {ns.root.name} holds items of shape {item_shape} made by "
                f"{loader.loader_id!r}; if the loader's output changed, give it a new loader_id"
            )
        raise
    store = open_directory(target)
    try:
        n = len(store)
        built = store.paths if hashes is not None else []
    finally:
        store.close()
    if n == 0:  # everything was skipped; never referenced, so nobody maps it
        remove_tree(target)
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
                remove_tree(ns.part_dir(part))
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
        segments = view.segments
        dead = sum(seg.n for seg in segments) - len(view)
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
        remove_tree(ns.part_dir(part))
