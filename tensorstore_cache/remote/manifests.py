"""A cache namespace on a remote prefix: numbered create-only manifests and part bundles.

Layout under ``<remote>/<namespace name>/`` (the name the namespace has on a
local disk, a fingerprint of the transform)::

    manifests/<generation, 8 digits>.json   created once, never rewritten; the highest is current
    head.json                               a hint of the current generation (may lag)
    parts/<part id>.tar                     one object per part: all of its files
    leases/g<generation>.a<attempt>.json    see tensorstore_cache.remote.lease

A commit creates manifest ``g + 1`` naming every part of ``g`` and the new
one; the part is uploaded first, so no manifest names a missing object. The
loser of a commit reads the winner's manifest and tries ``g + 2``. Old
generations are snapshots: incomplete, never wrong. A reader finds the
current generation from what it knew (or ``head.json``) by reading the next
manifest until one is absent.

A part travels as one object (an uncompressed tar of its directory), checked
against the size and XXH3-128 its manifest records before it is unpacked, so
a fresh node needs one request per part.
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from ..errors import CorruptStoreError, StoreNotFoundError, UnsafeRemoteError
from ..format import hashes_path
from ..fs import discard_tree
from .objects import Objects, new_token

__all__ = ["PartRef", "RemoteManifest", "RemoteNamespace", "check_conditional"]

_CHUNK = 1 << 20
_SIDE = "source_xxh3"


@dataclass(frozen=True, slots=True)
class PartRef:
    """A part named by a manifest: its id and its bundle's size and XXH3-128."""

    id: str
    size: int
    xxh3: str

    def doc(self) -> dict[str, Any]:
        return {"id": self.id, "size": self.size, "xxh3": self.xxh3}


@dataclass(frozen=True, slots=True)
class RemoteManifest:
    """One generation: its parts (later ones override earlier ones for a key), and the keys
    its commit skipped (``on_error="skip"``)."""

    generation: int
    parts: tuple[PartRef, ...]
    skipped: tuple[str, ...] = ()


class RemoteNamespace:
    """The objects of one namespace under a remote prefix."""

    def __init__(self, objects: Objects, name: str) -> None:
        self.objects = objects
        self.name = name

    def rel(self, tail: str) -> str:
        return f"{self.name}/{tail}"

    def where(self) -> str:
        return self.objects.where(self.name)

    def _manifest_rel(self, gen: int) -> str:
        return self.rel(f"manifests/{gen:08d}.json")

    def read_manifest(self, gen: int) -> RemoteManifest | None:
        """Generation ``gen``, None if it was never committed."""
        doc = self.objects.read_json(self._manifest_rel(gen))
        if doc is None:
            return None
        try:
            parts = tuple(PartRef(str(p["id"]), int(p["size"]), str(p["xxh3"]))
                          for p in doc["parts"])
            skipped = tuple(str(k) for k in doc.get("skipped", ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(
                f"{self.objects.where(self._manifest_rel(gen))!r} is not a manifest ({exc!r})"
            ) from None
        if int(doc.get("generation", -1)) != gen or any("/" in p.id for p in parts):
            raise CorruptStoreError(f"{self.objects.where(self._manifest_rel(gen))!r} is "
                                    "not the manifest of its generation")
        return RemoteManifest(gen, parts, skipped)

    def exists(self, gen: int) -> bool:
        """Whether generation ``gen`` is committed (one request)."""
        return self.objects.read(self._manifest_rel(gen)) is not None

    def current(self, known: int | None) -> tuple[RemoteManifest | None, bool, set[str]]:
        """The current generation, from ``known`` (what this node knew) or the head hint.

        Returns the manifest (None: nothing committed yet, or generation
        ``known`` itself), whether it is generation ``known`` (the caller's copy
        is current), and the keys skipped by the commits read on the way.
        """
        start = known if known is not None else self._head()
        gen, found = start, None
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
            found = self.read_manifest(gen)
            if found is None:
                raise CorruptStoreError(f"{self.where()!r}: head.json names generation {gen}, "
                                        "which has no manifest")
        return found, False, skipped

    def _head(self) -> int:
        doc = self.objects.read_json(self.rel("head.json"))
        return int(doc.get("generation", 0)) if doc is not None else 0

    def commit(self, gen: int, parts: list[PartRef], skipped: list[str]) -> bool:
        """Create manifest ``gen``; True if this call's write is it."""
        body = {"generation": gen, "parts": [p.doc() for p in parts], "skipped": skipped}
        return self.objects.create(self._manifest_rel(gen), body, new_token())

    def write_head(self, gen: int) -> None:
        """Point the hint at ``gen`` (a hint only: readers look further themselves)."""
        with contextlib.suppress(OSError):
            self.objects.write(self.rel("head.json"), {"generation": gen})

    def upload_part(self, part_dir: Path, part: str, scratch: Path) -> PartRef:
        """Pack ``part_dir`` (and its sources' hashes beside it, if any) into one object and
        upload it as ``parts/<part>.tar``."""
        bundle = scratch / f"{part}.{new_token()}.tar"
        side = hashes_path(part_dir)
        with tarfile.open(bundle, "w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(part_dir.rglob("*")):
                if path.is_file():
                    tar.add(path, arcname=f"part/{path.relative_to(part_dir)}", recursive=False)
            if side.is_file():
                tar.add(side, arcname=_SIDE, recursive=False)
        try:
            size, digest = _digest(bundle)
            self.objects.put_file(bundle, self.rel(f"parts/{part}.tar"))
        finally:
            bundle.unlink()
        return PartRef(part, size, digest)

    def download_part(self, ref: PartRef, target: Path, scratch: Path,
                      dir_mode: int, file_mode: int) -> None:
        """Fetch part ``ref`` and unpack it as the directory ``target`` (published by one
        rename, its sources' hashes beside it first), checked.

        Raises
        ------
        StoreNotFoundError
            If the object is gone (removed by hand: no manifest names a missing part).
        CorruptStoreError
            If it does not match its manifest's size and hash.
        """
        rel = self.rel(f"parts/{ref.id}.tar")
        bundle = scratch / f"{ref.id}.{new_token()}.tar"
        try:
            try:
                self.objects.get_file(rel, bundle)
            except FileNotFoundError:
                raise StoreNotFoundError(
                    f"{self.objects.where(rel)!r}, named by the namespace's manifest, is gone: "
                    "something deleted it; remove the namespace's prefix to build it again"
                ) from None
            if _digest(bundle) != (ref.size, ref.xxh3):
                raise CorruptStoreError(f"{self.objects.where(rel)!r} does not match the size "
                                        "and XXH3-128 its manifest records")
            unpacked = scratch / f"{ref.id}.{new_token()}"
            try:
                _unpack(bundle, unpacked, dir_mode, file_mode)
                if (unpacked / _SIDE).is_file():
                    os.replace(unpacked / _SIDE, hashes_path(target))
                os.rename(unpacked / "part", target)
            finally:
                discard_tree(unpacked)
        finally:
            bundle.unlink(missing_ok=True)


def _unpack(bundle: Path, target: Path, dir_mode: int, file_mode: int) -> None:
    with tarfile.open(bundle, "r") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not (member.name == _SIDE
                                           or member.name.startswith("part/")):
                raise CorruptStoreError(f"{bundle.name} holds {member.name!r}, not a file")
        tar.extractall(target, filter="data")  # no link, device or path outside target
    for path in [target, *target.rglob("*")]:
        os.chmod(path, dir_mode if path.is_dir() else file_mode)


def _digest(path: Path) -> tuple[int, str]:
    h = xxhash.xxh3_128()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def check_conditional(objects: Objects, verdicts: Path, *, probe: bool = True) -> None:
    """Refuse a remote that ignores create-only writes; the verdict is kept in ``verdicts``.

    The probe creates one object twice: the second create must fail. A
    verdict found in ``verdicts`` (a file of the node cache) costs no request.
    With ``probe=False`` only such a verdict is checked (no request either way).

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
        first = objects.create(rel, {"probe": 1}, new_token())
        # the raw answer: a lost response cannot turn "exists" into "created"
        verdict = first and not objects.create_raw(rel, b"{}")
        verdicts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = verdicts.with_name(f".{verdicts.name}.{new_token()}")
        tmp.write_text(json.dumps({"url": objects.url, "honours_create_only": verdict}))
        os.replace(tmp, verdicts)
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
