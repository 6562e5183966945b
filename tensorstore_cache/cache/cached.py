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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..config import OnStale, SourceCheck
from ..errors import BuildError, CorruptStoreError, StaleSourceError, StoreNotFoundError
from ..format import write_hashes
from ..fs import Holder, parse_temp, racy_since, remove_tree
from ..identity import LoaderFingerprint
from ..reader import CacheStore, open_directory, stale_keys, token_map, view_of
from ..writer import (
    BuildOptions,
    Schema,
    build,
    build_to_url,
    building,
    collect_debris,
    write_merged,
)
from .cluster import PartUrl, RemoteOptions, fill_remote, lease_deadline
from .compact import merge_start
from .fingerprint import fingerprint, namespace_name
from .loader_record import after_build, before_build
from .mirror import node_copy, pointer_path, write_pointer
from .namespace import Manifest, Namespace
from .seen_sources import NodeSeenSources

__all__ = ["CacheOptions", "cached_store"]

logger = logging.getLogger("tensorstore_cache")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheOptions:
    """The options of one :func:`~tensorstore_cache.cached` call."""

    build: BuildOptions
    """How to compute what is missing."""
    identity: SourceCheck = "stat"
    """How a cached entry is known to be current: its source's stat, its content hash, never
    stale, or the version ``tokens`` of the requested keys."""
    tokens: Callable[[list[str]], npt.ArrayLike] | None = None
    """With ``identity="token"``: the keys' version tokens, called once per call."""
    on_stale: OnStale = "rebuild"
    """What to do with stale entries."""
    lock_timeout: float | None = None
    """Seconds to wait at most for another process's build (and another machine's lease)."""
    named: LoaderFingerprint | None = None
    """The loader's automatic fingerprint, when it is named by one (no ``loader_id``)."""
    remote: RemoteOptions | None = None
    """The remote prefix sharing the namespace with other machines (None: this node only)."""


#: Every requested key's version token (``identity="token"``), else None.
_Tokens = dict[str, int] | None


#: Errors that mean "what this process was opening was removed meanwhile" when they come
#: from an open made without the namespace's lock (gc, or a merge, may remove it then).
_VANISHED = (StoreNotFoundError, FileNotFoundError, CorruptStoreError)
#: Attempts under the lock where locks do not work (gc may then remove what we open).
_UNLOCKED_ATTEMPTS = 5


def cached_store(cache_dir: Path, keys: list[str], options: CacheOptions) -> CacheStore:
    """Return a store of the namespace of ``options``'s loader holding every key of ``keys``.

    A first look, without any lock, returns the current store if it holds
    every key, current. Otherwise the namespace's build lock is taken, and
    everything that follows happens under it: the plan (against every key,
    since housekeeping may have removed the namespace since the first look),
    the build of what is missing or stale, the publication and the opening of
    the store returned. :func:`~tensorstore_cache.cache.housekeeping.gc` removes
    nothing of a namespace without holding its lock, so that store holds
    every key (but those this call skipped, ``on_error="skip"``), checked
    before it is returned.

    Parameters
    ----------
    cache_dir
        The cache directory (see :func:`tensorstore_cache.config.cache_root`).
    keys
        Distinct normalised keys.
    options
        What to compute and how.
    """
    info = options.build.loader
    fp = fingerprint(info.loader_id, info.params, options.build.dtype, options.build.schema,
                     options.build.names)
    remote = options.remote
    ns = Namespace(cache_dir / namespace_name(fp), fp, trust=options.build.trust,
                   storage_options=remote.storage_options if remote is not None else None)
    named = options.named
    new = named is not None and before_build(cache_dir, ns.root, named, options.build.trust)
    try:
        tokens = _tokens(keys, options)
        store, seen = _look(ns, keys, options, tokens)
        if store is None:
            store = _under_lock(ns, keys, options, seen, tokens)
        if named is not None:
            after_build(ns.root, named, new, options.build.trust)
        return store
    finally:
        ns.close()  # the store returned holds its own descriptors


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
    ns: Namespace, store: CacheStore | None, keys: list[str], options: CacheOptions,
    tokens: _Tokens,
) -> tuple[list[str], list[str]]:
    """Return ``(missing, stale)`` keys of ``keys`` against ``store``.

    With ``remote=`` and ``identity="stat"``, a source whose stat differs from the
    recorded one is judged by its content hash, and the stats found to hold the
    recorded bytes are remembered in the node namespace
    (:mod:`~tensorstore_cache.cache.seen_sources`).
    """
    if store is None or not keys:
        return list(keys), []
    rows = store.rows(keys, missing="ignore")
    missing = [keys[i] for i in np.flatnonzero(rows < 0).tolist()]
    if options.on_stale == "ignore":
        return missing, []
    by_key = (lambda _found: tokens) if tokens is not None else None
    seen = NodeSeenSources(ns) if _copied_sources(options) else None
    stale = stale_keys(view_of(store), keys, rows, kind=options.identity, tokens=by_key,
                       seen=seen)
    if seen is not None:
        seen.save()
    return missing, stale


def _copied_sources(options: CacheOptions) -> bool:
    """Whether each node may hold its own copy of the sources: a namespace shared through
    ``remote=`` under ``identity="stat"`` (content hashes recorded and compared)."""
    return options.remote is not None and options.identity == "stat"


def _tokens(keys: list[str], options: CacheOptions) -> _Tokens:
    """Call the identity function once with every requested key (new ones included)."""
    if options.identity != "token":
        return None
    assert options.tokens is not None
    return token_map(keys, options.tokens)


def _open(ns: Namespace, manifest: Manifest | None, *, pin: bool) -> CacheStore | None:
    if manifest is None or not manifest.parts:
        return None
    return ns.open_parts(manifest.parts, pin=pin)


def _empty(ns: Namespace, item_shape: tuple[int, ...] | None) -> CacheStore:
    return ns.open_parts([], pin=False, item_shape=item_shape)


#: What the first look found when it returned no store: the live parts it opened and the
#: keys they lack or hold stale (None: it found nothing usable, plan every key again).
_Seen = tuple[tuple[str, ...], list[str]] | None


def _look(
    ns: Namespace, keys: list[str], options: CacheOptions, tokens: _Tokens
) -> tuple[CacheStore | None, _Seen]:
    """The first look, without the lock: the current store if it holds every key, current."""
    try:
        ns.ensure()
        ns.touch()
        manifest = ns.current()
        view = _open(ns, manifest, pin=True)
    except _VANISHED as exc:
        # housekeeping removed the namespace (or a part) while we opened it without the
        # lock: the same open under the lock either succeeds or is a true error
        logger.info("%s changed while being opened (%s); taking its lock", ns.root.name, exc)
        return None, None
    if view is None:
        if keys:
            return None, None
        return _empty(ns, options.build.loader.item_shape), None
    assert manifest is not None
    try:
        missing, stale = _plan(ns, view, keys, options, tokens)
    except BaseException:
        view.close()
        raise
    if not missing and not stale:
        return view, None  # most calls end here, without any lock
    view.close()
    if stale and options.on_stale == "raise":
        raise StaleSourceError(stale)
    return None, (manifest.parts, missing + stale)


def _under_lock(
    ns: Namespace, keys: list[str], options: CacheOptions, seen: _Seen, tokens: _Tokens
) -> CacheStore:
    """Build what is missing or stale and open the result, all under the namespace's lock."""
    # A worker of this namespace's own build (or its loader) fails here instead of waiting
    # for the lock its builder holds.
    with building(ns.root):
        deadline = lease_deadline(options.lock_timeout)
        lock = ns.lock()
        locked = lock.acquire(  # False: no locks here
            timeout=options.lock_timeout, on_wait=_reporter(ns, options.build.progress)
        )
        try:
            # The lock's preparation opened the directories before the lock file: gc may
            # have removed the namespace and another caller made it again in between. The
            # lock taken is the namespace's now at its path, which stays: open that one.
            ns.ensure()
            for attempt in range(_UNLOCKED_ATTEMPTS):
                try:
                    if options.remote is not None:
                        return _fill_remote(ns, keys, options, tokens, options.remote, deadline)
                    return _fill(ns, keys, options, seen, tokens)
                except _VANISHED:
                    # Under the lock nothing is removed: a true error. Without working
                    # locks, housekeeping may have crossed us: start afresh.
                    if locked or attempt == _UNLOCKED_ATTEMPTS - 1:
                        raise
                    logger.info("%s changed while in use; starting afresh", ns.root.name)
                    seen = None
                    ns.ensure()
        finally:
            lock.release()
    raise AssertionError("unreachable")


def _fill(
    ns: Namespace, keys: list[str], options: CacheOptions, seen: _Seen, tokens: _Tokens
) -> CacheStore:
    """Under the lock: plan, build, publish, then open the store and check it holds ``keys``.

    ``seen`` is what the first look found. If every part it opened is still
    live, every key it found is still found (parts are immutable, and merges
    keep every entry), so only the keys it lacked or found stale are planned
    again; otherwise (housekeeping removed the namespace or merged parts
    meanwhile) every key is.
    """
    base = ns.current()
    same = seen is not None and base is not None and set(seen[0]) <= set(base.parts)
    wanted = seen[1] if same and seen is not None else keys
    missing, stale, item_shape, schema = _plan_build(ns, base, wanted, options, tokens)
    todo = missing + stale
    skipped: set[str] = set()
    if todo:
        _sweep_debris(ns)
        if stale:
            logger.info("recomputing %d stale entries of %s", len(stale), ns.root.name)
        label = _progress_label(options, item_shape, schema, len(missing), len(stale), len(keys))
        part, skipped = _build_part(ns, todo, options, item_shape, schema, label, tokens)
        if part is not None:
            manifest = _publish_part(ns, part, todo)
            if manifest is not None:
                _maybe_compact(ns, manifest)
    return _open_complete(ns, keys, skipped, item_shape)


def _open_complete(
    ns: Namespace, keys: list[str], skipped: set[str], item_shape: tuple[int, ...] | None
) -> CacheStore:
    """The namespace's current store (an empty one of ``item_shape`` if none), checked to hold
    every key but those skipped; closed again if it does not."""
    final = _open(ns, ns.current(), pin=True)
    store = final if final is not None else _empty(ns, item_shape)
    try:
        _check_complete(store, keys, skipped)
    except BaseException:
        store.close()
        raise
    return store


def _plan_build(
    ns: Namespace, base: Manifest | None, wanted: list[str], options: CacheOptions,
    tokens: _Tokens,
) -> tuple[list[str], list[str], tuple[int, ...] | None, Schema | None]:
    """Plan ``wanted`` against manifest ``base``: ``(missing, stale, item_shape, schema)``,
    the item shape or schema a build must give (the namespace's, else the loader's)."""
    item_shape = options.build.loader.item_shape
    schema = options.build.schema
    view = _open(ns, base, pin=False)
    try:
        missing, stale = _plan(ns, view, wanted, options, tokens)
        if stale and options.on_stale == "raise":
            raise StaleSourceError(stale)
        if view is not None and view.spec.records:
            schema = view.spec.schema  # declared, or inferred at the first build: enforced
        elif view is not None:
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
    return missing, stale, item_shape, schema


def _fill_remote(
    ns: Namespace, keys: list[str], options: CacheOptions, tokens: _Tokens,
    remote: RemoteOptions, deadline: float | None,
) -> CacheStore:
    """Under the lock, with ``remote=``: the cluster's namespace holds ``keys`` once this
    returns (see :mod:`~tensorstore_cache.cache.cluster`); open it and check."""

    def todo() -> tuple[list[str], list[str]]:
        missing, stale, _shape, _schema = _plan_build(ns, ns.current(), keys, options, tokens)
        if options.identity == "token":  # a version every node sees alike: for the cluster
            return missing + stale, []
        return missing, stale  # another copy's bytes: recomputed for this node only

    def build_part(left: list[str], at: PartUrl | None) -> tuple[str | None, set[str]]:
        missing, stale, item_shape, schema = _plan_build(ns, ns.current(), left, options,
                                                         tokens)
        _sweep_debris(ns)
        label = _progress_label(options, item_shape, schema, len(missing), len(stale),
                                len(keys))
        # for the cluster, on a given executor: its tasks upload the part from where they run
        upload = (at, remote) if at is not None and options.build.executor is not None else None
        return _build_part(ns, missing + stale, options, item_shape, schema, label, tokens,
                           upload)

    for attempt in range(_UNLOCKED_ATTEMPTS):
        skipped = fill_remote(ns, remote, deadline, todo, build_part)
        try:
            return _open_complete(ns, keys, skipped, options.build.loader.item_shape)
        except StoreNotFoundError:
            # a part's copy evicted from the node cache (by another process under its cap)
            # between its fetch and this open: fetch it again
            if attempt == _UNLOCKED_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _check_complete(store: CacheStore, keys: list[str], skipped: set[str]) -> None:
    """Raise unless ``store`` holds every key but those skipped (never return a short store)."""
    if not keys:
        return
    absent = np.flatnonzero(store.rows(keys, missing="ignore") < 0).tolist()
    if not absent:
        return
    known = skipped | {key for key, _reason in store.spec.skipped}
    short = [keys[i] for i in absent if keys[i] not in known]
    if short:
        raise StoreNotFoundError(
            f"the cache {store.location!r} lacks {len(short)} of the {len(keys)} keys asked "
            f"for after they were built (e.g. {short[0]!r}): something removed its parts "
            "while this process held its lock; check that nothing but tensorstore_cache "
            "deletes files in the cache directory"
        )


def _sweep_debris(ns: Namespace) -> None:
    """Remove temporary entries that dead processes of this host left in ``parts/``."""
    try:
        names = os.listdir(ns.parts_dir)
    except OSError:
        return
    for name in names:
        temp = parse_temp(name)
        if temp is not None:
            collect_debris(ns.parts_dir / temp.target)


def _progress_label(
    options: CacheOptions,
    item_shape: tuple[int, ...] | None,
    schema: Schema | None,
    new: int,
    changed: int,
    total: int,
) -> str:
    """What a build's progress bar says: the loader, the item and the work.

    E.g. ``building image/1 3x32x32 float32, 300 new of 20,000``, or for
    records ``building covers/1 (image, title_ids, rating), ...``; stale
    entries computed again are counted as ``changed``.
    """
    info = options.build.loader
    name = info.loader_id.removeprefix("tensorstore_cache.")  # the built-in image loader
    if schema is not None:
        what = f"{name} ({', '.join(n for n, _f in schema)})"
    else:
        shape = "x".join(map(str, item_shape)) if item_shape is not None else None
        what = " ".join(w for w in (name, shape, options.build.dtype) if w)
    work = ", ".join(([f"{new:,} new"] if new or not changed else [])
                     + ([f"{changed:,} changed"] if changed else []))
    return f"building {what}, {work} of {total:,}"


def _build_part(
    ns: Namespace,
    todo: list[str],
    options: CacheOptions,
    item_shape: tuple[int, ...] | None,
    schema: Schema | None,
    label: str,
    tokens: _Tokens,
    upload: tuple[PartUrl, RemoteOptions] | None = None,
) -> tuple[str | None, set[str]]:
    """Build ``todo`` into a new part; return its id (None if nothing was built) and the
    keys the build skipped (``on_error="skip"``).

    With ``upload`` (where the cluster's parts lie, and the remote) the part is
    built at its remote URL, its tasks uploading their shards from wherever
    they run (:func:`~tensorstore_cache.writer.build_to_url`), and kept in the
    node cache (its metadata and index), the namespace holding its pointer.

    ``item_shape`` or ``schema`` (the namespace's, else the loader's or the
    declared one) spares the builder a probing call of the loader, so every
    item is computed exactly once.
    ``label`` is what its progress bar says.
    Content hashes of the sources (every one with ``identity="content"`` or
    ``remote=``, racily clean ones always), taken before each source was read,
    go to the part's side file.
    """
    part = ns.new_part_id()
    target = ns.part_dir(part)
    loader = dataclasses.replace(options.build.loader, item_shape=item_shape)
    build_options = dataclasses.replace(
        options.build, loader=loader, overwrite=False,
        # records the stat (as "stat" does) and every source's content hash
        identity="content" if _copied_sources(options) else options.identity,
        tokens=tokens,
        label=label, schema=schema,
    )
    started = time.time_ns()
    try:
        if upload is None:
            hashes = build(todo, target, build_options)
        else:
            hashes = _build_at(todo, target, upload[0](part), build_options, upload[1])
    except BuildError as exc:
        if item_shape is not None and any("must have shape" in r for _p, r in exc.failures):
            exc.add_note(
                f"the cache {ns.root.name} holds items of shape {item_shape} made by "
                f"{loader.loader_id!r}; if the loader's output changed, give it a new loader_id"
            )
        raise
    store = (open_directory(target, trust=ns.trust) if upload is None
             else ns.open_parts([part], pin=False))
    try:
        n = len(store)
        skipped = {key for key, _reason in store.spec.skipped}
        if n and hashes is not None and _copied_sources(options):
            _remember_built(ns, store, hashes, racy_since(started))
    finally:
        store.close()
    if n == 0:  # everything was skipped; never referenced, so nobody maps it
        _drop_part(ns, target)
        return None, skipped
    if hashes is not None:
        write_hashes(target, hashes, trust=ns.trust)
    return part, skipped


def _build_at(
    todo: list[str], target: Path, url: str, options: BuildOptions, remote: RemoteOptions
) -> npt.NDArray[np.uint64] | None:
    """Build ``todo`` as the part at ``url`` (its tasks upload their shards there), keep this
    node's copy in the node cache and point ``target`` at it; return the sources' hashes."""
    hashes, copy = build_to_url(todo, url, options, cache_dir=target.parent.parent.parent,
                                storage_options=remote.storage_options)
    write_pointer(target, url, copy.name, options.trust)
    return hashes


def _drop_part(ns: Namespace, target: Path) -> None:
    """Remove a part built here that no manifest names: its directory, or its pointer and
    its copy in the node cache (what its build uploaded stays for ``gc(remote=...)``)."""
    copy = None if target.is_dir() else node_copy(target, ns.trust)
    if copy is None:
        remove_tree(target)
        return
    pointer_path(target).unlink(missing_ok=True)
    remove_tree(copy)


def _remember_built(
    ns: Namespace, store: CacheStore, hashes: npt.NDArray[np.uint64], settled: int
) -> None:
    """Note in the node namespace that the sources of a part built here held the bytes it
    recorded at the stats it recorded (those modified before ``settled``): this node's next
    call then only stats them (see :mod:`~tensorstore_cache.cache.seen_sources`)."""
    recorded = view_of(store).source_identity(np.arange(len(store)), content_hash=False)
    keys = store.paths
    ok = np.flatnonzero((hashes != 0) & (recorded.size >= 0) & (recorded.mtime_ns < settled))
    seen = NodeSeenSources(ns)
    seen.learn([keys[i] for i in ok.tolist()], recorded.size[ok], recorded.mtime_ns[ok],
               hashes[ok])
    seen.save()


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
            with ns.open_parts([part], pin=False) as own:
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
        rows = [seg.n for seg in view_of(view).segments]
        start = merge_start(rows, sum(rows) - len(view))
    finally:
        view.close()
    if start is None:
        return
    part = ns.new_part_id()
    logger.info("merging %d parts of %s into %s", len(rows) - start, ns.root.name, part)
    with ns.open_parts(manifest.parts[start:], pin=False) as merged:
        write_merged(merged, ns.part_dir(part), trust=ns.trust)
    published = ns.publish(
        [*manifest.parts[:start], part],
        base=manifest.generation,
        entries=manifest.entries,
        item_shape=manifest.item_shape,
    )
    if published is None:  # someone published meanwhile (no working lock): drop ours
        remove_tree(ns.part_dir(part))
