"""Cache namespaces: one directory per transform, holding immutable parts and manifests.

Layout of a namespace (``<cache_dir>/<slug>-<fingerprint>/``)::

    namespace.json           what every vector here is: loader id and parameters,
                             dtype, format version (written once)
    manifests/<gen>.json     generation-numbered manifests; the highest one is current
    parts/<id>/              immutable stores written by build_store, one per build
    parts/<id>.source_xxh3   optional content hashes of a part's sources
    lock                     build lock (flock); holds "pid host time what"
    last_used                touched whenever the namespace is opened

A manifest lists the live parts, oldest first; a later part overrides an
earlier one for the same key. A new manifest is written to a temporary file,
fsynced, then *hard-linked* to ``manifests/<gen+1>.json``: ``link`` fails if
the name exists, so of two writers racing for the same generation exactly
one wins (this holds on NFS too) and the other re-reads and adopts or
extends the winner's manifest. Published files are never rewritten; parts
that no manifest references any more are deleted only by housekeeping
(:mod:`tensorstore_cache.cache.gc`).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptStoreError, StoreNotFoundError
from ..format.metadata import shard_count
from ..format.spec import StoreSpec
from ..fs.durable import fsync_dir, write_json_durable
from ..fs.locks import BuildLock, ReaderHold
from ..fs.safe import read_json
from ..reader.overlay import Overlay
from ..reader.segment import Segment
from ..reader.store import CacheStore
from .fingerprint import NAMESPACE_KIND, canonical_json

__all__ = ["Manifest", "Namespace", "is_namespace", "open_namespace", "open_parts"]

_INFO = "namespace.json"
_MANIFEST_KIND = "tensorstore_cache.manifest"
_MANIFEST_NAME = re.compile(r"(\d{1,18})\.json")
_PART_ID = re.compile(r"[0-9a-f]{8,16}-[0-9a-f]{8}")
_MAX_MANIFEST = 16 << 20
_MAX_PARTS = 100_000


@dataclass(frozen=True, slots=True)
class Manifest:
    """One generation of a namespace: its live parts, oldest first."""

    generation: int
    parts: tuple[str, ...]
    entries: int
    """Distinct keys over the live parts (as counted by the writer)."""
    item_shape: tuple[int, ...] | None
    created_unix: float
    path: Path


def is_namespace(root: Path) -> bool:
    """Whether ``root`` looks like a cache namespace directory."""
    return (root / _INFO).is_file() and not (root / "zarr.json").exists()


class Namespace:
    """The files of one namespace directory.

    Parameters
    ----------
    root
        The namespace directory.
    fp
        Its fingerprint, when known (required to create it).
    """

    def __init__(self, root: Path, fp: dict[str, Any] | None = None) -> None:
        self.root = root
        self.fp = fp
        self.parts_dir = root / "parts"
        self.manifests_dir = root / "manifests"
        self.lock_path = root / "lock"
        self.last_used_path = root / "last_used"

    # -- creation and identity ------------------------------------------------

    def ensure(self) -> None:
        """Create the directories and ``namespace.json`` if missing; check it otherwise."""
        assert self.fp is not None
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self.manifests_dir.mkdir(exist_ok=True)
        info = self.root / _INFO
        if not info.exists():
            tmp = self.root / f".{_INFO}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
            write_json_durable(tmp, self.fp)
            try:
                os.link(tmp, info)
            except FileExistsError:
                pass
            except OSError:  # no hard links here: rename (we are not racing for content)
                with contextlib.suppress(OSError):
                    os.rename(tmp, info)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            fsync_dir(self.root)
        found = self.info()
        if canonical_json(found) != canonical_json(self.fp):
            raise CorruptStoreError(
                f"{info} describes {canonical_json(found)[:300]} but this namespace is for "
                f"{canonical_json(self.fp)[:300]}; the cache directory is damaged - remove "
                f"{str(self.root)!r}",
                str(info),
            )

    def info(self) -> dict[str, Any]:
        """Return ``namespace.json``."""
        info = read_json(self.root / _INFO, max_bytes=1 << 20)
        if info.get("kind") != NAMESPACE_KIND or not isinstance(info.get("loader_id"), str):
            raise CorruptStoreError(
                f"{self.root / _INFO} is not a tensorstore_cache namespace description",
                str(self.root / _INFO),
            )
        return info

    def touch(self) -> None:
        """Mark the namespace as used now (for age- and LRU-based collection)."""
        try:
            os.utime(self.last_used_path)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                self.last_used_path.touch()
        except OSError:
            pass  # a read-only cache: usage is not recorded

    def lock(self) -> BuildLock:
        """Return the namespace's build lock (not yet taken)."""
        return BuildLock(self.lock_path, prepare=self.ensure if self.fp is not None else None)

    # -- manifests ------------------------------------------------------------

    def generations(self) -> list[int]:
        """Return every manifest generation on disk, ascending."""
        try:
            names = os.listdir(self.manifests_dir)
        except FileNotFoundError:
            return []
        gens = [int(m.group(1)) for n in names if (m := _MANIFEST_NAME.fullmatch(n))]
        return sorted(gens)

    def manifest_path(self, generation: int) -> Path:
        """Return the file of manifest ``generation``."""
        return self.manifests_dir / f"{generation:012d}.json"

    def current(self) -> Manifest | None:
        """Return the newest manifest, or None if nothing was published yet."""
        gens = self.generations()
        return self.read_manifest(gens[-1]) if gens else None

    def read_manifest(self, generation: int) -> Manifest:
        """Read and validate manifest ``generation``."""
        path = self.manifest_path(generation)
        raw = read_json(path, max_bytes=_MAX_MANIFEST)
        where = str(path)
        parts = raw.get("parts")
        entries = raw.get("entries")
        shape = raw.get("item_shape")
        if (
            raw.get("kind") != _MANIFEST_KIND
            or raw.get("generation") != generation
            or not isinstance(parts, list)
            or len(parts) > _MAX_PARTS
            or not all(isinstance(p, str) and _PART_ID.fullmatch(p) for p in parts)
            or len(set(parts)) != len(parts)
            or type(entries) is not int
            or entries < 0
            or not (shape is None or (isinstance(shape, list) and all(type(d) is int for d in shape)))
        ):
            raise CorruptStoreError(
                f"{where} is not a valid manifest (kind, generation, parts, entries); the "
                "cache directory is damaged - remove the namespace or this file",
                where,
            )
        created = raw.get("created_unix", 0.0)
        return Manifest(
            generation,
            tuple(parts),
            entries,
            None if shape is None else tuple(shape),
            float(created) if isinstance(created, (int, float)) else 0.0,
            path,
        )

    def publish(
        self, parts: list[str], *, base: int, entries: int, item_shape: tuple[int, ...] | None
    ) -> Manifest | None:
        """Publish manifest ``base + 1`` listing ``parts``; None if another writer got there first."""
        generation = base + 1
        value = {
            "kind": _MANIFEST_KIND,
            "generation": generation,
            "parts": parts,
            "entries": entries,
            "item_shape": None if item_shape is None else list(item_shape),
            "created_unix": time.time(),
            "writer": f"{socket.gethostname()}:{os.getpid()}",
        }
        target = self.manifest_path(generation)
        tmp = self.manifests_dir / f".{generation}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        write_json_durable(tmp, value)
        try:
            try:
                os.link(tmp, target)  # atomic, fails if the name exists (also over NFS)
            except FileExistsError:
                return None
            except OSError:  # a filesystem without hard links
                if target.exists():
                    return None
                os.rename(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fsync_dir(self.manifests_dir)
        return self.read_manifest(generation)

    def new_part_id(self) -> str:
        """Return a fresh part id (sortable by creation time)."""
        return f"{int(time.time() * 1000):x}"[-16:].rjust(8, "0") + "-" + uuid.uuid4().hex[:8]

    def part_dir(self, part: str) -> Path:
        """Return the directory of part ``part``."""
        return self.parts_dir / part


def _check_segment(seg: Segment, info: dict[str, Any], root: Path) -> None:
    spec = seg.spec
    same = (
        spec.loader_id == info["loader_id"]
        and spec.dtype == info["dtype"]
        and spec.format_version == info["format_version"]
        and canonical_json(spec.loader_params) == canonical_json(info["loader_params"])
    )
    if not same:
        raise CorruptStoreError(
            f"part {str(seg.root)!r} was made by {spec.loader_id!r} {spec.loader_params} "
            f"{spec.dtype}, not by what namespace {str(root)!r} holds; the cache directory "
            "is damaged - remove the namespace",
            str(seg.root),
        )


def open_parts(
    location: str, parts: tuple[str, ...] | list[str], *, pin: bool = True
) -> CacheStore:
    """Open exactly ``parts`` of the namespace at ``location`` as one store.

    Parameters
    ----------
    location
        The namespace directory.
    parts
        Part ids, oldest first.
    pin
        Take a reader's hold on every part (housekeeping then keeps it while
        this store is open) and map every shard now, so that the store keeps
        working even if the namespace is deleted afterwards.

    Raises
    ------
    StoreNotFoundError
        If a part was removed (by housekeeping after it stopped being current).
    """
    root = Path(location)
    ns = Namespace(root)
    info = ns.info()
    holds: list[ReaderHold] = []
    segments: list[Segment] = []
    try:
        for part in parts:
            if not _PART_ID.fullmatch(part):
                raise CorruptStoreError(f"{part!r} is not a part id", str(root))
            pdir = ns.part_dir(part)
            if pin:
                holds.append(ReaderHold(pdir / "zarr.json"))
            try:
                seg = Segment(pdir)
            except StoreNotFoundError:
                raise StoreNotFoundError(
                    f"part {part} of the cache {str(root)!r} no longer exists (housekeeping "
                    "removes parts no longer current, or the whole namespace was collected); "
                    "call tensorstore_cache.cached() again to get the current store"
                ) from None
            _check_segment(seg, info, root)
            if pin:
                for k in range(shard_count(seg.spec)):
                    seg.shard(k)
            segments.append(seg)
        spec = _view_spec(segments, info)
    except BaseException:
        for seg in segments:
            seg.close()
        for hold in holds:
            hold.close()
        raise
    return CacheStore(
        segments, spec, str(root), reopen=(open_parts, (str(root), tuple(parts))), resources=holds
    )


def _view_spec(segments: list[Segment], info: dict[str, Any]) -> StoreSpec:
    if not segments:
        return StoreSpec(
            n=0,
            item_shape=(0,),
            dtype=info["dtype"],
            loader_id=info["loader_id"],
            loader_params=info["loader_params"],
        )
    shapes = {seg.spec.item_shape for seg in segments}
    if len(shapes) > 1:
        raise CorruptStoreError(
            f"the parts of {str(segments[0].root.parent.parent)!r} hold items of different "
            f"shapes {sorted(shapes)}; the loader changed its output without a new loader_id - "
            "give it a new loader_id (or remove the namespace)",
            str(segments[-1].root),
        )
    biggest = max(segments, key=lambda s: s.n)
    return StoreSpec(
        n=sum(s.n for s in segments) if len(segments) > 1 else segments[0].n,
        item_shape=biggest.spec.item_shape,
        dtype=biggest.spec.dtype,
        loader_id=biggest.spec.loader_id,
        loader_params=biggest.spec.loader_params,
        format_version=biggest.spec.format_version,
        rows_per_shard=biggest.spec.rows_per_shard,
        skipped=_still_skipped(segments),
        created_unix=max(seg.spec.created_unix for seg in segments),
    )


def _still_skipped(segments: list[Segment]) -> tuple[tuple[str, str], ...]:
    """Sources a part skipped that no part holds (a later build may have succeeded)."""
    overlay = Overlay(segments)
    out: dict[str, str] = {}
    for seg in segments:
        for key, reason in seg.spec.skipped:
            if overlay.find(key)[0] < 0:
                out[key] = reason
    return tuple(out.items())


def open_namespace(root: Path, *, pin: bool = True) -> CacheStore:
    """Open the current generation of the namespace at ``root``.

    Raises
    ------
    StoreNotFoundError
        If nothing was published in it yet.
    """
    ns = Namespace(root)
    for _attempt in range(5):
        manifest = ns.current()
        if manifest is None:
            raise StoreNotFoundError(
                f"the cache namespace {str(root)!r} holds nothing yet; fill it with "
                "tensorstore_cache.cached()"
            )
        try:
            store = open_parts(str(root), manifest.parts, pin=pin)
        except StoreNotFoundError:
            if ns.current() == manifest:
                raise
            continue  # a newer generation replaced it meanwhile: open that one
        ns.touch()
        return store
    raise StoreNotFoundError(f"the cache namespace {str(root)!r} changes too fast to be opened")
