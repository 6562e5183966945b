"""A cache namespace on a remote prefix: numbered create-only manifests, parts and their bundles.

Layout under ``<remote>/<namespace name>/`` (the name the namespace has on a
local disk, a fingerprint of the transform)::

    manifests/<generation, 8 digits>.json   created once, never rewritten; the highest is current
    head.json                               a hint: the current generation and a copy of its
                                            manifest (may lag)
    parts/<part id>/                        a part: a store, every file (group zarr.json last)
    parts/<part id>.bundle                  its metadata and index in one object
    leases/g<generation>.a<attempt>.json    see tensorstore_cache.remote.lease

A commit creates manifest ``g + 1`` naming every part of ``g`` and the new
one; the part and its bundle are uploaded first, so no manifest names a
missing object. The loser of a commit reads the winner's manifest and tries
``g + 2``. Old generations are snapshots: incomplete, never wrong. A reader
finds the current generation from what it knew (or ``head.json``) by reading
the next manifest until one is absent; when it started from the head hint and
nothing is newer, the hint's copy of the manifest spares it one more read.

A node opens a part from its bundle (checked against the size and XXH3-128
its manifest records; see :mod:`tensorstore_cache.remote.bundle`) and fetches
its shards from ``parts/<id>/`` when first read, through the node cache. So a
fresh node needs one request per part before it can read.

Every object holds its ``kind`` and ``version``
(:mod:`tensorstore_cache.remote.documents`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptStoreError, StoreNotFoundError, UnsafeRemoteError
from ..format import GROUP, GroupMetadata
from ..fs import Trust, file_digest, make_dir, write_replace
from .bundle import BUNDLE_SUFFIX, Bundle, pack_bundle
from .documents import check_document, document
from .objects import Objects, new_token
from .urls import version_name

__all__ = ["PartRef", "RemoteManifest", "RemoteNamespace", "check_conditional", "parse_manifest"]


@dataclass(frozen=True, slots=True)
class PartRef:
    """A part named by a manifest: its id, its bundle's size and XXH3-128, and the XXH3-128
    of its group ``zarr.json`` (the name of its version in a node cache)."""

    id: str
    size: int
    xxh3: str
    group: str

    def doc(self) -> dict[str, Any]:
        return {"id": self.id, "size": self.size, "xxh3": self.xxh3, "group_xxh3": self.group}

    @classmethod
    def from_doc(cls, doc: Any) -> PartRef:
        """A part of a manifest document (``KeyError``, ``TypeError`` or ``ValueError`` if
        it is not one)."""
        ref = cls(str(doc["id"]), int(doc["size"]), str(doc["xxh3"]), str(doc["group_xxh3"]))
        if "/" in ref.id or not ref.id or ref.size < 0:
            raise ValueError(f"bad part {ref.id!r}")
        return ref


@dataclass(frozen=True, slots=True)
class RemoteManifest:
    """One generation: its parts (later ones override earlier ones for a key), and the keys
    its commit skipped (``on_error="skip"``)."""

    generation: int
    parts: tuple[PartRef, ...]
    skipped: tuple[str, ...] = ()

    def doc(self) -> dict[str, Any]:
        """The manifest document (without its writer's token)."""
        return document("manifest", {"generation": self.generation,
                                     "parts": [p.doc() for p in self.parts],
                                     "skipped": list(self.skipped)})


def parse_manifest(doc: Mapping[str, Any], gen: int, where: str) -> RemoteManifest:
    """The manifest of generation ``gen`` in ``doc``, read at ``where``.

    Raises
    ------
    CorruptStoreError
        If it is no manifest (of a version this release reads) of generation ``gen``.
    """
    check_document(doc, "manifest", where)
    try:
        parts = tuple(PartRef.from_doc(p) for p in doc["parts"])
        skipped = tuple(str(k) for k in doc.get("skipped", ()))
        found = doc["generation"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptStoreError(f"{where!r} is not a manifest ({exc!r})", where) from None
    if type(found) is not int or found != gen or len({p.id for p in parts}) != len(parts):
        raise CorruptStoreError(f"{where!r} is not the manifest of generation {gen}", where)
    return RemoteManifest(gen, parts, skipped)


class RemoteNamespace:
    """The objects of one namespace under a remote prefix."""

    def __init__(self, objects: Objects, name: str) -> None:
        self.objects = objects
        self.name = name

    def rel(self, tail: str) -> str:
        return f"{self.name}/{tail}"

    def where(self) -> str:
        return self.objects.where(self.name)

    def part_url(self, part: str) -> str:
        """The URL (or directory) of the store of ``part``."""
        return self.objects.where(self.rel(f"parts/{part}"))

    def _manifest_rel(self, gen: int) -> str:
        return self.rel(f"manifests/{gen:08d}.json")

    def read_manifest(self, gen: int) -> RemoteManifest | None:
        """Generation ``gen``, None if it was never committed."""
        rel = self._manifest_rel(gen)
        doc = self.objects.read_json(rel)
        return None if doc is None else parse_manifest(doc, gen, self.objects.where(rel))

    def exists(self, gen: int) -> bool:
        """Whether generation ``gen`` is committed (one request)."""
        return self.objects.read(self._manifest_rel(gen)) is not None

    def current(self, known: int | None) -> tuple[RemoteManifest | None, bool, set[str]]:
        """The current generation, from ``known`` (what this node knew) or the head hint.

        Returns the manifest (None: nothing committed yet, or generation
        ``known`` itself), whether it is generation ``known`` (the caller's copy
        is current), and the keys skipped by the commits read on the way.
        """
        hinted = self._head() if known is None else None
        gen = known if known is not None else (hinted.generation if hinted is not None else 0)
        found = None
        skipped: set[str] = set()
        while True:
            after = self.read_manifest(gen + 1)
            if after is None:
                break
            gen, found = gen + 1, after
            skipped.update(after.skipped)
        if found is None and gen == known:
            return None, True, skipped
        if found is None and gen > 0:
            found = hinted  # the hint's copy: nothing is newer
        return found, False, skipped

    def _head(self) -> RemoteManifest | None:
        """The manifest the head hint copies (None: no hint yet)."""
        rel = self.rel("head.json")
        doc = self.objects.read_json(rel)
        if doc is None:
            return None
        where = self.objects.where(rel)
        check_document(doc, "head", where)
        gen, copy = doc.get("generation"), doc.get("manifest")
        if type(gen) is not int or gen < 1 or not isinstance(copy, dict):
            raise CorruptStoreError(f"{where!r} is not a head hint", where)
        return parse_manifest(copy, gen, f"{where} (its manifest)")

    def commit(self, manifest: RemoteManifest) -> bool:
        """Create the manifest of ``manifest``'s generation; True if this call's write is it."""
        return self.objects.create(self._manifest_rel(manifest.generation), manifest.doc(),
                                   new_token())

    def write_head(self, manifest: RemoteManifest) -> None:
        """Point the hint at ``manifest`` (a hint only: readers look further themselves)."""
        body = document("head", {"generation": manifest.generation, "manifest": manifest.doc()})
        with contextlib.suppress(OSError):
            self.objects.write(self.rel("head.json"), body)

    def upload_part(self, part_dir: Path, part: str, scratch: Path, trust: Trust) -> PartRef:
        """Upload the part at ``part_dir`` as ``parts/<part>/`` (data files, then array
        metadata, the group ``zarr.json`` last), then its bundle."""
        files = sorted(GroupMetadata.read(part_dir, trust=trust).files)
        prefix = self.rel(f"parts/{part}")
        for batch in ([r for r in files if not r.endswith(GROUP)],
                      [r for r in files if r.endswith(GROUP)], [GROUP]):
            self.objects.put_files([(part_dir / r, f"{prefix}/{r}") for r in batch])
        return self.upload_bundle(part_dir, part, scratch, trust)

    def upload_bundle(
        self, store: Path, part: str, scratch: Path, trust: Trust, *, side: Path | None = None
    ) -> PartRef:
        """Upload the bundle of part ``part``, whose store is whole at ``parts/<part>/``
        already; ``store`` is a local copy of it (every file a bundle holds) and ``side``
        the content hashes of its sources (default: beside ``store``)."""
        bundle = scratch / f"{part}.{new_token()}{BUNDLE_SUFFIX}"
        try:
            pack_bundle(store, part, bundle, trust, side=side)
            size, digest = file_digest(bundle)
            self.objects.put_file(bundle, self.rel(f"parts/{part}{BUNDLE_SUFFIX}"))
        finally:
            bundle.unlink(missing_ok=True)
        return PartRef(part, size, digest, version_name((store / GROUP).read_bytes()))

    def fetch_bundle(self, ref: PartRef, scratch: Path) -> Bundle:
        """Download the bundle of part ``ref`` into ``scratch`` (the caller removes its file),
        checked against the size and hash its manifest records.

        Raises
        ------
        StoreNotFoundError
            If the object is gone (removed by hand: no manifest names a missing part).
        CorruptStoreError
            If it does not match its manifest's size and hash, or is no bundle of ``ref``.
        """
        rel = self.rel(f"parts/{ref.id}{BUNDLE_SUFFIX}")
        where = self.objects.where(rel)
        path = scratch / f"{ref.id}.{new_token()}{BUNDLE_SUFFIX}"
        try:
            try:
                self.objects.get_file(rel, path)
            except FileNotFoundError:
                raise StoreNotFoundError(
                    f"{where!r}, named by the namespace's manifest, is gone: something deleted "
                    "it; remove the namespace's prefix to build it again") from None
            if file_digest(path) != (ref.size, ref.xxh3):
                raise CorruptStoreError(f"{where!r} does not match the size and XXH3-128 its "
                                        "manifest records", where)
            return Bundle.read(path, ref.id, where)
        except BaseException:
            path.unlink(missing_ok=True)
            raise


def check_conditional(
    objects: Objects, verdicts: Path, *, probe: bool = True, trust: Trust | None = None
) -> None:
    """Refuse a remote that ignores create-only writes; the verdict is kept in ``verdicts``.

    The probe creates one object twice: the second create must fail. A
    verdict found in ``verdicts`` (a file of the node cache) costs no request.
    With ``probe=False`` only such a verdict is checked (no request either way).
    ``trust`` (the node cache's) gives the modes of the verdict's directory and file,
    so that every member of a shared cache may write them (default: private).

    Raises
    ------
    UnsafeRemoteError
        If the remote let the second create replace the first (now or before).
    """
    verdict = _read_verdict(verdicts, objects.url)
    if verdict is None and not probe:
        return
    if verdict is None:
        rel = f".tsc-probe/{new_token()}.json"
        body = document("probe", {})
        first = objects.create(rel, body, new_token())
        # the raw answer: a lost response cannot turn "exists" into "created"
        again = json.dumps({**body, "writer": new_token()}, sort_keys=True).encode()
        verdict = first and not objects.create_raw(rel, again)
        mode = trust if trust is not None else Trust.private()
        for parent in reversed([verdicts.parent, verdicts.parent.parent]):
            make_dir(parent, mode)
        text = json.dumps({"url": objects.url, "honours_create_only": verdict})
        write_replace(verdicts, [memoryview(text.encode())], trust=mode)
    if not verdict:
        raise UnsafeRemoteError(
            f"the remote {objects.url!r} ignores create-only writes (If-None-Match: *): a "
            "second create of one object replaced the first, so machines could overwrite each "
            "other's commits; use a store that supports them (AWS S3, MinIO, GCS, R2, a "
            f"shared directory), then delete {str(verdicts)!r} to probe again"
        )


def _read_verdict(verdicts: Path, url: str) -> bool | None:
    try:
        doc: Mapping[str, Any] = json.loads(verdicts.read_text())
    except (OSError, ValueError):
        return None
    if doc.get("url") != url or not isinstance(doc.get("honours_create_only"), bool):
        return None
    return bool(doc["honours_create_only"])
