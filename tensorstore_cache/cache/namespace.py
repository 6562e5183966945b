"""Cache namespaces: one directory per transform, holding immutable parts and manifests.

Layout of a namespace (``<cache_dir>/<slug>-<fingerprint>/``)::

    namespace.json           what every vector here is: loader id and parameters,
                             dtype, format version (written once)
    manifests/<gen>.json     generation-numbered manifests; the highest one is current
    parts/<id>/              immutable stores written by build_store, one per build
    parts/<id>.source_xxh3   optional content hashes of a part's sources
    parts/<id>.remote        a part kept in the node cache instead (see .mirror)
    lock                     build lock (flock); holds "pid host time what"
    last_used                touched whenever the namespace is opened

A manifest lists the live parts, oldest first; a later part overrides an
earlier one for the same key. A new manifest is written to a temporary file,
fsynced, then *hard-linked* to ``manifests/<gen+1>.json``: ``link`` fails if
the name exists, so of two writers racing for the same generation exactly
one wins (this holds on NFS too) and the other re-reads and adopts or
extends the winner's manifest. Published files are never rewritten; parts
that no manifest references any more are deleted only by housekeeping
(:mod:`tensorstore_cache.cache.housekeeping`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptStoreError, StoreNotFoundError, UntrustedCacheError
from ..format import read_hashes, schema_from_json
from ..fs import (
    ExclusiveLock,
    SharedHold,
    Trust,
    create_file,
    fsync_dir,
    open_dir,
    open_file,
    open_root,
    parse_json_fd,
    temp_path,
    write_json_durable,
    write_replace,
)
from ..reader import CacheStore, MadeBy, SegmentSource, assemble
from ..remote import reduce_public
from .fingerprint import NAMESPACE_KIND, canonical_json
from .mirror import node_part

__all__ = [
    "Manifest",
    "Namespace",
    "NamespaceDirectory",
    "NamespaceParts",
    "is_namespace",
    "open_namespace",
    "open_parts",
    "valid_part_id",
]

_INFO = "namespace.json"
_MANIFEST_KIND = "tensorstore_cache.manifest"
_MANIFEST_NAME = re.compile(r"(\d{1,18})\.json")
_PART_ID = re.compile(r"[0-9a-f]{8,16}-[0-9a-f]{8}")
_MAX_MANIFEST = 16 << 20
_MAX_PARTS = 100_000
#: Attempts to create a namespace that housekeeping keeps removing meanwhile.
_ENSURE_ATTEMPTS = 50


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


def valid_part_id(part: str) -> bool:
    """Whether ``part`` is a part id (as :meth:`Namespace.new_part_id` makes them)."""
    return _PART_ID.fullmatch(part) is not None


def is_namespace(root: Path) -> bool:
    """Whether ``root`` looks like a cache namespace directory."""
    return (root / _INFO).is_file() and not (root / "zarr.json").exists()


class Namespace:
    """The files of one namespace directory.

    Everything is read through descriptors opened from the cache directory
    down and checked against ``trust`` (owner and mode, see
    :mod:`tensorstore_cache.fs.trust`): the cache directory, the namespace,
    ``manifests/`` and ``parts/`` once (again at every :meth:`ensure`), each
    file when it is read.

    Parameters
    ----------
    root
        The namespace directory.
    fp
        Its fingerprint, when known (required to create it).
    trust
        Whose files may be read, and the modes of those created (default: the
        current user's private cache). ``Trust.explicit`` opens a namespace the
        user named by its path (checked only from there down, warned about).
    storage_options
        Options of the fsspec filesystem of the parts kept in the node cache
        (see :mod:`~tensorstore_cache.cache.mirror`).
    """

    def __init__(
        self, root: Path, fp: dict[str, Any] | None = None, *, trust: Trust | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.fp = fp
        self.trust = trust if trust is not None else Trust.private()
        self.storage_options = None if storage_options is None else dict(storage_options)
        """Options of the fsspec filesystem of the parts kept in the node cache."""
        self.parts_dir = root / "parts"
        self.manifests_dir = root / "manifests"
        self.lock_path = root / "lock"
        self.last_used_path = root / "last_used"
        self._fds: dict[str, int] = {}
        self._closer = weakref.finalize(self, _close_all, self._fds)
        self._info: dict[str, Any] | None = None  # namespace.json, parsed once per open

    # -- descriptors ----------------------------------------------------------

    def close(self) -> None:
        """Close the directory descriptors (they are reopened, and re-read, when needed)."""
        _close_all(self._fds)
        self._info = None

    def _dir(self, create: bool = False) -> int:
        """The checked descriptor of the namespace directory."""
        fd = self._fds.get(".")
        if fd is None:
            if self.trust.kind == "explicit":
                fd = open_root(self.root, self.trust, create=create)
            else:
                top = open_root(self.root.parent, self.trust, create=create)
                try:
                    fd = open_dir(self.root.name, self.trust, dir_fd=top, create=create,
                                  shown=self.root)
                finally:
                    os.close(top)
            self._fds["."] = fd
        return fd

    def _sub(self, name: str, create: bool = False) -> int:
        """The checked descriptor of ``manifests/`` or ``parts/``."""
        fd = self._fds.get(name)
        if fd is None:
            fd = open_dir(name, self.trust, dir_fd=self._dir(create), create=create,
                          shown=self.root / name)
            self._fds[name] = fd
        return fd

    def _read(self, name: str, dir_fd: int, path: Path, max_bytes: int) -> dict[str, Any]:
        try:
            fd = open_file(name, self.trust, dir_fd=dir_fd, shown=path)
        except FileNotFoundError:
            raise StoreNotFoundError(f"{path} does not exist") from None
        return parse_json_fd(fd, path, max_bytes=max_bytes)

    def read_file(self, name: str, max_bytes: int) -> bytes | None:
        """The bytes of the file ``name`` of the namespace directory (checked against the
        trust), None if there is none.

        Raises
        ------
        CorruptStoreError
            If it is larger than ``max_bytes`` or not a regular file.
        """
        path = self.root / name
        try:
            fd = open_file(name, self.trust, dir_fd=self._dir(), shown=path)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise CorruptStoreError(f"{path} is larger than {max_bytes} bytes", str(path))
        return data

    def replace_file(self, name: str, data: bytes) -> None:
        """Replace the file ``name`` of the namespace directory with ``data`` (atomically,
        with the cache's modes)."""
        write_replace(self.root / name, [memoryview(data)], trust=self.trust)

    # -- creation and identity ------------------------------------------------

    def ensure(self) -> None:
        """Create the directories and ``namespace.json`` if missing; check it otherwise.

        The directories are (re)opened and checked here: a namespace that
        housekeeping removed meanwhile is recreated, and used from then on
        (also when it is removed again while being recreated).
        """
        for attempt in range(_ENSURE_ATTEMPTS):
            try:
                self._ensure_once()
                return
            except FileNotFoundError:  # StoreNotFoundError too: removed while being made
                if attempt == _ENSURE_ATTEMPTS - 1:
                    raise
                time.sleep(0.002 * (attempt + 1))

    def _ensure_once(self) -> None:
        assert self.fp is not None
        self.close()
        self._sub("parts", create=True)
        self._sub("manifests", create=True)
        info = self.root / _INFO
        try:
            os.stat(_INFO, dir_fd=self._dir(), follow_symlinks=False)
        except FileNotFoundError:
            tmp = temp_path(info, "new")
            write_json_durable(tmp, self.fp, trust=self.trust)
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
        """Return ``namespace.json`` (read once while the directory stays open)."""
        if self._info is not None:
            return self._info
        path = self.root / _INFO
        try:
            ns_fd = self._dir()
        except (FileNotFoundError, NotADirectoryError):
            raise StoreNotFoundError(f"no cache namespace at {str(self.root)!r}") from None
        info = self._read(_INFO, ns_fd, path, 1 << 20)
        if (
            info.get("kind") != NAMESPACE_KIND
            or not isinstance(info.get("loader_id"), str)
            or not isinstance(info.get("loader_params"), dict)
            or not isinstance(info.get("dtype"), str)
            or type(info.get("format_version")) is not int
        ):
            raise CorruptStoreError(
                f"{path} is not a tensorstore_cache namespace description", str(path)
            )
        self._info = info
        return info

    def touch(self) -> None:
        """Mark the namespace as used now (for age- and LRU-based collection)."""
        try:
            fd = create_file("last_used", self.trust, dir_fd=self._dir(), kind="member-write",
                             exclusive=False, shown=self.last_used_path)
        except UntrustedCacheError:
            raise
        except OSError:
            return  # a read-only cache: usage is not recorded
        try:
            os.utime(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def lock(self) -> ExclusiveLock:
        """Return the namespace's build lock (not yet taken).

        Taking it prepares the namespace (:meth:`ensure`) before it opens the lock file;
        whoever holds it calls :meth:`ensure` again, since gc may have removed the
        namespace, and another process made it again, in between.
        """
        return ExclusiveLock(self.lock_path, prepare=self.ensure if self.fp is not None else None,
                             trust=self.trust)

    # -- manifests ------------------------------------------------------------

    def generations(self) -> list[int]:
        """Return every manifest generation on disk, ascending."""
        try:
            names = os.listdir(self._sub("manifests"))
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
        raw = self._read(path.name, self._sub("manifests"), path, _MAX_MANIFEST)
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
            generation=generation,
            parts=tuple(parts),
            entries=entries,
            item_shape=None if shape is None else tuple(shape),
            created_unix=float(created) if isinstance(created, (int, float)) else 0.0,
            path=path,
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
        tmp = temp_path(target, "new")
        write_json_durable(tmp, value, trust=self.trust)
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

    def identity(self, item_shape: tuple[int, ...] | None = None) -> MadeBy:
        """What made every vector of this namespace (from ``namespace.json``)."""
        info = self.info()
        declared = info.get("fields")
        schema = None
        if isinstance(declared, list):
            try:
                schema = schema_from_json(declared)
            except ValueError as exc:
                path = self.root / _INFO
                raise CorruptStoreError(f"{path}: {exc}", str(path)) from None
        return MadeBy(
            loader_id=info["loader_id"], loader_params=info["loader_params"], dtype=info["dtype"],
            format_version=info["format_version"], item_shape=item_shape, schema=schema,
        )

    def open_parts(
        self,
        parts: tuple[str, ...] | list[str],
        *,
        pin: bool = True,
        item_shape: tuple[int, ...] | None = None,
    ) -> CacheStore:
        """Open exactly ``parts`` of this namespace as one store (see :func:`open_parts`).

        ``item_shape`` is the item shape of a store of no parts (default: unknown).
        A part kept in the node cache (see :mod:`~tensorstore_cache.cache.mirror`)
        is held there, never pinned: its shards are fetched when first read.
        """
        root = self.root
        where = NamespaceParts(str(root), tuple(parts), self.trust, self.storage_options)
        identity = self.identity(item_shape)
        for part in parts:
            if not _PART_ID.fullmatch(part):
                raise CorruptStoreError(f"{part!r} is not a part id", str(root))
        parts_fd = self._sub("parts") if parts else -1
        opened: list[int] = []
        try:
            sources = [self._source(part, parts_fd, pin, opened) for part in parts]
            return assemble(where, sources, identity=identity)  # closes the holds if it fails
        except StoreNotFoundError as exc:
            raise StoreNotFoundError(
                f"a part of the cache {str(root)!r} no longer exists ({exc}; housekeeping removes "
                "parts no longer current, or the whole namespace was collected); call "
                "tensorstore_cache.cached() again to get the current store"
            ) from None
        finally:
            for fd in opened:
                os.close(fd)

    def _source(self, part: str, parts_fd: int, pin: bool, opened: list[int]) -> SegmentSource:
        """The segment of ``part``: its directory, else its copy in the node cache."""
        part_dir = self.part_dir(part)
        hashes = functools.partial(read_hashes, part_dir, trust=self.trust, dir_fd=parts_fd)
        try:
            os.stat(part, dir_fd=parts_fd, follow_symlinks=False)
        except FileNotFoundError:
            kept = node_part(part_dir, parts_fd, self.trust,
                             storage_options=self.storage_options, hashes=hashes)
            if kept is not None:
                opened.append(kept[1])
                return kept[0]
        return SegmentSource(
            root=part_dir, trust=self.trust, parent_fd=parts_fd, pin=pin, hashes=hashes,
            # housekeeping keeps a part while a process holds it
            resources=[SharedHold(part_dir / "zarr.json")] if pin else (),
        )


def _close_all(fds: dict[str, int]) -> None:
    while fds:
        _name, fd = fds.popitem()
        with contextlib.suppress(OSError):
            os.close(fd)


@dataclass(frozen=True, slots=True)
class NamespaceParts:
    """The location of a store of given parts of a cache namespace (pinned when opened)."""

    root: str
    """The namespace directory."""
    parts: tuple[str, ...]
    """Part ids, oldest first."""
    trust: Trust
    """Whose files may be read."""
    storage_options: dict[str, Any] | None = None
    """Options of the fsspec filesystem of the parts kept in the node cache (None: fsspec's
    defaults and environment)."""

    @property
    def shown(self) -> str:
        """The namespace directory."""
        return self.root

    def __reduce__(self) -> tuple[Any, ...]:
        return reduce_public(self)  # no credential in a pickle

    def open(self) -> CacheStore:
        """Open exactly these parts, pinned: the same rows, under the same rules."""
        return open_parts(self.root, self.parts, trust=self.trust,
                          storage_options=self.storage_options)


@dataclass(frozen=True, slots=True)
class NamespaceDirectory:
    """A cache namespace named by its path: opening it opens its current generation."""

    root: str
    """The namespace directory."""
    trust: Trust
    """Whose files may be read."""

    @property
    def shown(self) -> str:
        """The namespace directory."""
        return self.root

    def open(self) -> CacheStore:
        """Open the current generation (see :func:`open_namespace`)."""
        return open_namespace(Path(self.root), trust=self.trust)


def open_parts(
    location: str,
    parts: tuple[str, ...] | list[str],
    *,
    pin: bool = True,
    trust: Trust | None = None,
    storage_options: Mapping[str, Any] | None = None,
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
    trust
        Whose files may be read (default: the current user's private cache).
    storage_options
        Options of the fsspec filesystem of parts kept in the node cache.

    Raises
    ------
    StoreNotFoundError
        If a part was removed (by housekeeping after it stopped being current).
    UntrustedCacheError
        If a directory or file fails ``trust``.
    """
    ns = Namespace(Path(location), trust=trust, storage_options=storage_options)
    try:
        return ns.open_parts(parts, pin=pin)
    finally:
        ns.close()


def open_namespace(root: Path, *, pin: bool = True, trust: Trust | None = None) -> CacheStore:
    """Open the current generation of the namespace at ``root``.

    ``trust`` defaults to a namespace the user names by its path (warned
    about if others can write it, never refused). Opening takes no lock: if
    housekeeping removes or replaces what is being opened, the namespace is
    looked up again (a newer generation is opened; a namespace removed
    meanwhile holds nothing).

    Raises
    ------
    StoreNotFoundError
        If nothing was published in it (or it was removed by housekeeping).
    CorruptStoreError
        If a part of the current generation is damaged.
    """
    ns = Namespace(root, trust=trust if trust is not None else Trust.explicit(root))
    try:
        for _attempt in range(5):
            manifest = ns.current()
            if manifest is None:
                raise StoreNotFoundError(
                    f"the cache namespace {str(root)!r} holds nothing yet; fill it with "
                    "tensorstore_cache.cached()"
                )
            try:
                store = ns.open_parts(manifest.parts, pin=pin)
            except (StoreNotFoundError, CorruptStoreError, FileNotFoundError):
                ns.close()  # look the namespace up again, by its path
                try:
                    now = ns.current()
                except (StoreNotFoundError, FileNotFoundError):
                    now = None
                if now is not None and now.parts == manifest.parts and now.path == manifest.path:
                    raise  # nothing changed: the error is about these very files
                continue  # removed or replaced meanwhile: open what is there now
            ns.touch()
            return store
    finally:
        ns.close()
    raise StoreNotFoundError(f"the cache namespace {str(root)!r} changes too fast to be opened")
