"""One namespace for a cluster: a node's namespace kept in step with a remote prefix.

With ``cached(..., remote=URL)`` the node's namespace directory (in
``cache_dir``) is this node's view of the namespace of the same name under
``URL`` (see :mod:`tensorstore_cache.remote.manifests`): its manifest always
lists exactly the parts of a remote generation, each kept in the node cache
(:mod:`~tensorstore_cache.cache.mirror`: its metadata and index from its
bundle, its shards fetched when first read, under the cache's cap and
eviction). Everything here runs in the process holding the node's build
lock, so the agents of one node meet at that lock and only its holder talks
to the remote:

1. find the current remote generation (from the one this node last saw, else
   the head hint) and fetch the bundles of the parts this node lacks;
2. nothing left to compute: done; else hold the lease on that generation,
   or wait, polling the next manifest and the lease, until someone commits
   (then go to 1) or the lease goes a lease time without a heartbeat (take over);
3. the holder builds what is missing into a local part, uploads it (its
   files, then its bundle) and moves it whole into the node cache, then
   commits by creating the next manifest (a build whose tasks run on a given
   executor has them upload their shards straight into the remote part, from
   wherever they run; the holder then uploads the rest of the part and its
   bundle, and keeps its metadata and index in the node cache); a lost race reads the winner's
   manifest, fetches its bundles and adopts it when it holds our keys, else
   commits after it. Past :data:`MAX_REMOTE_PARTS` parts the holder merges
   them into one and commits that too.

Correctness rests on the create-only manifests alone; the lease only saves work.

Keys the cluster holds but whose sources differ on this node (another copy's
bytes, judged by stat and then content hash; see
:mod:`~tensorstore_cache.cache.seen_sources`) are recomputed into *node
parts*: listed after the remote generation's parts in the node's manifest
(so they win), never uploaded, kept across syncs. Past
:data:`MAX_REMOTE_PARTS` node parts they are merged into one. A node whose
credentials may not write (or under ``$TSC_REMOTE_MODE=read``) builds what
the cluster lacks into node parts too.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CorruptStoreError
from ..format import hashes_path
from ..fs import discard_tree, write_json_durable, write_replace
from ..remote import (
    Lease,
    LeaseTimes,
    PartRef,
    RemoteManifest,
    RemoteNamespace,
    WriteDeniedError,
    acquire,
    adopt_version,
    check_conditional,
    install_bundle,
    monotonic,
    objects_at,
    remote_cache_root,
    stage,
    url_dir,
)
from ..writer import write_merged
from .mirror import node_copy, node_part_here, write_pointer
from .namespace import Namespace, valid_part_id

__all__ = ["MAX_REMOTE_PARTS", "MODE_ENV", "PartUrl", "RemoteOptions", "fill_remote",
           "lease_deadline", "probe_file", "read_only_from_env"]

#: More parts than this in a remote generation are merged into one by the next holder.
MAX_REMOTE_PARTS = 4
_STATE = "remote.json"
_SCRATCH = "remote-scratch"
_NOTHING = RemoteManifest(0, ())
#: The environment variable that makes every call read the remote only: ``read``.
MODE_ENV = "TSC_REMOTE_MODE"


def read_only_from_env() -> bool:
    """Whether ``$TSC_REMOTE_MODE`` says ``read`` (unset, empty or ``write``: no).

    Raises
    ------
    ValueError
        If it says something else.
    """
    raw = os.environ.get(MODE_ENV, "").strip()
    if raw.lower() in ("", "write"):
        return False
    if raw.lower() == "read":
        return True
    raise ValueError(f"${MODE_ENV}={raw!r} is not a mode: 'read' serves what the cluster holds "
                     "and builds what it lacks into this node's cache only; unset, every call "
                     "may write")


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteOptions:
    """Where a cached() call's namespace is shared, and the lease's times."""

    url: str
    """The remote prefix: an fsspec URL, a ``file://`` URL or a shared directory."""
    storage_options: Mapping[str, Any] | None = None
    """Options of the fsspec filesystem."""
    times: LeaseTimes = field(default_factory=LeaseTimes.from_env)
    """Lease time, heartbeat and polls."""
    read_only: bool = field(default_factory=read_only_from_env)
    """Never write to the remote (``$TSC_REMOTE_MODE=read``): misses are built for this node."""


#: Returns the keys of the call still to compute against the node's current namespace: those
#: for the cluster (missing), and those for this node only (its sources differ).
Todo = Callable[[], tuple[list[str], list[str]]]
#: Where the part of an id lies on the remote (its URL, or its directory).
PartUrl = Callable[[str], str]
#: Builds keys into a new part: its id (None if every key was skipped), the skipped keys.
#: Given a :data:`PartUrl`, the part is the cluster's, and the build may upload it there itself
#: (its tasks sending their shards from wherever they run), keeping it in the node cache
#: (:mod:`~tensorstore_cache.cache.mirror`); else it is a local part of the namespace.
Build = Callable[[list[str], PartUrl | None], tuple[str | None, set[str]]]


def probe_file(cache_dir: Path, url: str) -> Path:
    """Where the node cache keeps its verdict on whether ``url`` honours create-only writes."""
    return remote_cache_root(cache_dir) / "probes" / f"{url_dir(url)}.json"


def fill_remote(
    ns: Namespace, remote: RemoteOptions, deadline: float | None, todo: Todo, build: Build
) -> set[str]:
    """Under the node's lock: bring the namespace in step with the remote and compute, once in
    the cluster, what the call still lacks; return the keys skipped (``on_error="skip"``),
    by this node or by the commits it waited for.

    ``deadline`` (on :func:`~tensorstore_cache.remote.monotonic`) bounds the wait for
    another machine's lease (:class:`~tensorstore_cache.StoreLockedError`).
    """
    objects = objects_at(remote.url, remote.storage_options)
    node = _Node(ns, RemoteNamespace(objects, ns.root.name), _scratch(ns), objects.url,
                 read_only=remote.read_only)
    # a store known to ignore create-only writes is refused before any request
    check_conditional(objects, probe_file(ns.root.parent, objects.url), probe=False)
    seen = node.read_seen()
    excused: set[str] = set()
    try:
        while True:
            manifest, same, skipped = node.rns.current(
                seen.generation if seen is not None else None)
            excused |= skipped
            seen = node.sync(seen if same else manifest)
            left, own = (_unexcused(keys, excused) for keys in todo())
            if own:
                excused |= node.build_own(seen, own, build)
                left = [k for k in left if k not in excused]
            if not left:
                return excused
            base = seen
            lease = None if node.read_only else node.acquire(base, remote.times, deadline)
            if node.read_only:
                return excused | node.build_own(seen, left, build)
            if lease is None:
                continue  # someone committed the next generation: fetch it, plan again
            try:
                seen, built_skipped = _hold(node, base, left, todo, build)
            finally:
                lease.release()
            excused |= built_skipped
    finally:
        discard_tree(node.scratch)


def _unexcused(keys: list[str], excused: set[str]) -> list[str]:
    return [k for k in keys if k not in excused]


def _hold(
    node: _Node, base: RemoteManifest, left: list[str], todo: Todo, build: Build
) -> tuple[RemoteManifest, set[str]]:
    """Holding the lease: build ``left``, upload, commit; return what is committed and skipped."""
    stage("leased")
    try:
        part, skipped = build(left, node.rns.part_url)
    except Exception as exc:  # (Ctrl-C says enough)
        exc.add_note(f"nothing was committed to {node.rns.where()!r}: the lease is released "
                     "and the next call (of any node) builds these keys again; fix the cause "
                     "above, then call again")
        raise
    stage("built")
    try:
        return _commit(node, base, part, skipped, todo)
    except WriteDeniedError as exc:  # a read-only node after all: the part stays here
        node.deny(exc)
        node.keep_own(base, part)
        return base, skipped


def _commit(
    node: _Node, base: RemoteManifest, part: str | None, skipped: set[str], todo: Todo
) -> tuple[RemoteManifest, set[str]]:
    """Upload ``part`` and commit it on ``base`` (or after the winner of a race)."""
    ref = node.upload(part) if part is not None else None
    stage("uploaded")
    current = base
    while True:
        ours = RemoteManifest(current.generation + 1,
                              (*current.parts, *([ref] if ref is not None else [])),
                              tuple(sorted(skipped)))
        if node.rns.commit(ours):
            break
        theirs = node.rns.read_manifest(ours.generation)
        if theirs is None:
            raise CorruptStoreError(f"{node.rns.where()!r}: generation "
                                    f"{ours.generation} was taken but cannot be read")
        current = node.sync(theirs)
        if not _unexcused(todo()[0], skipped):
            return current, skipped  # the winner holds our keys: ours is never referenced
    stage("committed")
    committed = node.publish(ours)
    node.rns.write_head(committed)
    if len(committed.parts) > MAX_REMOTE_PARTS:
        committed = _compact(node, committed)
    return committed, skipped


def _compact(node: _Node, seen: RemoteManifest) -> RemoteManifest:
    """Merge every part of ``seen`` into one, upload it and commit it as the next generation."""
    ns = node.ns
    part = ns.new_part_id()
    with ns.open_parts([p.id for p in seen.parts], pin=False) as merged:
        write_merged(merged, ns.part_dir(part), trust=ns.trust)
    merged_gen = RemoteManifest(seen.generation + 1, (node.upload(part),))
    if not node.rns.commit(merged_gen):
        return seen  # someone committed meanwhile: keep theirs (ours is never referenced)
    committed = node.publish(merged_gen)
    node.rns.write_head(committed)
    return committed


@dataclass(slots=True)
class _Node:
    """This node's namespace, the remote one, a scratch directory for bundles, and this
    node's own parts (listed after the remote ones)."""

    ns: Namespace
    rns: RemoteNamespace
    scratch: Path
    url: str
    own: list[str] = field(default_factory=list)
    read_only: bool = False

    def deny(self, exc: WriteDeniedError) -> None:
        """The remote refused a write: read it only from now on, and say so once."""
        if not self.read_only:
            warnings.warn(
                f"{self.rns.where()!r} refused a write ({exc.strerror}): the credentials may "
                "only read; this call uses what the cluster holds and builds what it lacks "
                f"into this node's cache only (${MODE_ENV}=read says so from the start)",
                stacklevel=2)
        self.read_only = True

    def acquire(
        self, base: RemoteManifest, times: LeaseTimes, deadline: float | None
    ) -> Lease | None:
        """The lease on ``base`` (see :func:`~tensorstore_cache.remote.acquire`), the store
        probed first (once per node cache); None if the next generation was committed
        meanwhile or the remote refused the write."""
        try:
            # the store is probed before its first write (a node that only reads needs not)
            check_conditional(self.rns.objects, probe_file(self.ns.root.parent, self.url),
                              trust=self.ns.trust)
            return acquire(self.rns.objects, self.rns.rel("leases"), base.generation,
                           functools.partial(self.rns.exists, base.generation + 1), times,
                           deadline)
        except WriteDeniedError as exc:
            self.deny(exc)
            return None

    def build_own(self, seen: RemoteManifest, keys: list[str], build: Build) -> set[str]:
        """Build ``keys`` into a part of this node only and publish it; return those skipped."""
        part, skipped = build(keys, None)
        self.keep_own(seen, part)
        return skipped

    def keep_own(self, seen: RemoteManifest, part: str | None) -> None:
        """Publish ``seen`` with ``part`` (if any) added to this node's own parts (merged into
        one past :data:`MAX_REMOTE_PARTS`)."""
        if part is None:
            return
        self.own.append(part)
        if len(self.own) > MAX_REMOTE_PARTS:
            merged = self.ns.new_part_id()
            with self.ns.open_parts(self.own, pin=False) as view:
                write_merged(view, self.ns.part_dir(merged), trust=self.ns.trust)
            self.own[:] = [merged]
        self.publish(seen)

    def upload(self, part: str) -> PartRef:
        """Upload the part built here, then keep it in the node cache, data files included
        (a part its build uploaded and kept there: only its bundle is left to upload)."""
        ns = self.ns
        part_dir = ns.part_dir(part)
        copy = None if part_dir.is_dir() else node_copy(part_dir, ns.trust)
        if copy is not None:
            return self.rns.upload_bundle(copy, part, self.scratch, ns.trust,
                                          side=hashes_path(part_dir))
        ref = self.rns.upload_part(part_dir, part, self.scratch, ns.trust)
        url = self.rns.part_url(part)
        local = adopt_version(part_dir, url, cache_dir=ns.root.parent, trust=ns.trust)
        write_pointer(part_dir, url, local.name, ns.trust)
        return ref

    def sync(self, manifest: RemoteManifest | None) -> RemoteManifest:
        """Fetch the bundles of the parts of ``manifest`` this node lacks and make it the
        node's manifest (None: nothing committed yet)."""
        if manifest is None:
            return self.publish(_NOTHING)
        for ref in manifest.parts:
            if not valid_part_id(ref.id):
                raise CorruptStoreError(f"{self.rns.where()!r}: generation "
                                        f"{manifest.generation} names {ref.id!r}, not a part id")
            self._ensure(ref)
        return self.publish(manifest)

    def _ensure(self, ref: PartRef) -> None:
        """Put part ``ref`` in the node cache (from its bundle) unless it is there."""
        ns = self.ns
        part_dir = ns.part_dir(ref.id)
        if part_dir.is_dir() or node_part_here(part_dir, ns.trust):
            return
        bundle = self.rns.fetch_bundle(ref, self.scratch)
        try:
            url = self.rns.part_url(ref.id)
            local = install_bundle(bundle, url, cache_dir=ns.root.parent, trust=ns.trust)
            if local.name != ref.group:
                raise CorruptStoreError(f"{bundle.where!r} holds the metadata of another store "
                                        "than its manifest names", bundle.where)
            side = bundle.side_bytes()
            if side is not None:
                write_replace(hashes_path(part_dir), [memoryview(side)], trust=ns.trust)
            write_pointer(part_dir, url, local.name, ns.trust)
        finally:
            bundle.path.unlink(missing_ok=True)

    def publish(self, seen: RemoteManifest) -> RemoteManifest:
        """Publish a node manifest listing exactly ``seen``'s parts (unless it does already)
        and remember which remote generation it mirrors."""
        ns = self.ns
        local = ns.current()
        ids = [p.id for p in seen.parts] + self.own
        if local is None or list(local.parts) != ids:
            entries, shape = 0, None
            if ids:
                with ns.open_parts(ids, pin=False) as view:
                    entries, shape = len(view), view.spec.item_shape
            published = ns.publish(ids, base=local.generation if local is not None else 0,
                                   entries=entries, item_shape=shape)
            if published is None:  # only where locks do not work
                raise CorruptStoreError(f"{ns.root}: another process published while this one "
                                        "held the build lock; locks do not work here")
        tmp = ns.root / f".{_STATE}.tmp"
        write_json_durable(tmp, {"url": self.url, "generation": seen.generation,
                                 "parts": [p.doc() for p in seen.parts], "own": self.own},
                           trust=ns.trust)
        os.replace(tmp, ns.root / _STATE)
        return seen

    def read_seen(self) -> RemoteManifest | None:
        """The remote generation the node mirrors (None: unknown, another URL's, or changed
        since by housekeeping)."""
        try:
            doc = json.loads((self.ns.root / _STATE).read_text())
            if doc.get("url") != self.url:
                return None
            parts = tuple(PartRef.from_doc(p) for p in doc["parts"])
            own = [str(p) for p in doc.get("own", [])]
            local = self.ns.current()
            if [p.id for p in parts] + own != (list(local.parts) if local is not None else []):
                return None
            self.own[:] = own
            return RemoteManifest(int(doc["generation"]), parts)
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _scratch(ns: Namespace) -> Path:
    """A fresh directory for bundles on their way (the node's lock makes it ours alone)."""
    path = ns.root / _SCRATCH
    discard_tree(path)
    os.mkdir(path, ns.trust.dir_mode)
    return path


def lease_deadline(timeout: float | None) -> float | None:
    """The deadline of a wait of ``timeout`` seconds on the lease's clock."""
    return None if timeout is None else monotonic() + timeout
