"""A part's bundle: its metadata and index in one object, so a node opens a part with one request.

A part of a remote namespace is uploaded as a store (``parts/<id>/``, every file, the group
``zarr.json`` last) and, beside it, as one *bundle* object (``parts/<id>.bundle``) holding
what opening it needs: the group ``zarr.json``, every array's ``zarr.json`` and every
file that is not fetched on demand (the key index, the sources' stat, ragged offsets and
shapes), and the content hashes of its sources when it has them. Its bytes::

    magic            8 bytes  b"TSCBNDL\\n"
    header length    8 bytes  little-endian uint64 H (at most 16 MiB)
    header           H bytes  UTF-8 JSON object: kind "tensorstore_cache.remote.bundle",
                              version, part (its id), files ([[path, size], ...], the group
                              zarr.json first), source_xxh3 (the side file's size, or null)
    the files' bytes, in the header's order, then the side file's

Nothing else. The manifest naming the part records the bundle's size and XXH3-128
(checked before the bundle is read); every file taken out of it is checked against
the size and XXH3-128 its group ``zarr.json`` lists (by
:func:`~tensorstore_cache.remote.fetch.install_bundle`).
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptStoreError
from ..format import GROUP, GroupMetadata, fetched_files, hashes_path
from ..fs import Trust
from .documents import check_document, document

__all__ = ["BUNDLE_SUFFIX", "Bundle", "bundle_files", "pack_bundle"]

#: The name of a part's bundle object: ``parts/<id>`` + this.
BUNDLE_SUFFIX = ".bundle"
_MAGIC = b"TSCBNDL\n"
_MAX_HEADER = 16 << 20
_CHUNK = 1 << 20


def bundle_files(meta: GroupMetadata) -> list[str]:
    """The store files a bundle of a store of ``meta`` holds: the group ``zarr.json`` first,
    then every listed file that is not fetched on demand, sorted."""
    fetched = set(fetched_files(meta.spec))
    return [GROUP, *sorted(rel for rel in meta.files if rel not in fetched)]


def pack_bundle(
    part_dir: Path, part: str, out: Path, trust: Trust, *, side: Path | None = None
) -> None:
    """Write the bundle of part ``part`` to ``out``: its files from the store directory
    ``part_dir`` (a part, or this node's copy of one, which holds every file a bundle does),
    and the content hashes of its sources from ``side`` (default: the side file beside
    ``part_dir``; none if absent)."""
    meta = GroupMetadata.read(part_dir, trust=trust)
    rels = bundle_files(meta)
    sizes = [os.path.getsize(part_dir / rel) for rel in rels]
    side = side if side is not None else hashes_path(part_dir)
    side_size = side.stat().st_size if side.is_file() else None
    header = json.dumps(document("bundle", {
        "part": part, "files": [[rel, size] for rel, size in zip(rels, sizes, strict=True)],
        "source_xxh3": side_size}), sort_keys=True).encode()
    with open(out, "wb") as f:
        f.write(_MAGIC + len(header).to_bytes(8, "little") + header)
        for path in [*(part_dir / rel for rel in rels), *([side] if side_size is not None else [])]:
            with open(path, "rb") as src:
                while chunk := src.read(_CHUNK):
                    f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


@dataclass(frozen=True, slots=True)
class Bundle:
    """A downloaded bundle, its header checked: where each file's bytes lie in it."""

    path: Path
    where: str
    """The object's URL, for messages."""
    files: dict[str, tuple[int, int]]
    """Offset and size of every file, by store-relative path."""
    side: tuple[int, int] | None
    """Offset and size of the sources' content hashes (None: none)."""

    @classmethod
    def read(cls, path: Path, part: str, where: str) -> Bundle:
        """Check the header of the bundle of ``part`` downloaded to ``path``.

        Raises
        ------
        CorruptStoreError
            If it is no bundle of ``part`` this release reads, or its sizes do not add up.
        """
        with open(path, "rb") as f:
            head = f.read(16)
            length = int.from_bytes(head[8:16], "little") if len(head) == 16 else -1
            if head[:8] != _MAGIC or not 0 < length <= _MAX_HEADER:
                raise CorruptStoreError(f"{where!r} is not a part bundle (no bundle header)",
                                        where)
            raw = f.read(length)
        total = os.path.getsize(path)
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise CorruptStoreError(f"{where!r}: its header is not JSON ({exc})", where) from None
        if not isinstance(doc, dict):
            raise CorruptStoreError(f"{where!r}: its header is not a JSON object", where)
        check_document(doc, "bundle", where)
        files, side, end = _layout(doc, part, where, 16 + length)
        if end != total:
            raise CorruptStoreError(f"{where!r} is {total} bytes; its header describes {end}",
                                    where)
        return cls(path, where, files, side)

    def read_file(self, rel: str) -> bytes:
        """The bytes of the store file ``rel``.

        Raises
        ------
        CorruptStoreError
            If the bundle does not hold it.
        """
        span = self.files.get(rel)
        if span is None:
            raise CorruptStoreError(f"{self.where!r} lacks {rel!r}, a file its part's metadata "
                                    "lists", self.where)
        return self._pread(*span)

    def side_bytes(self) -> bytes | None:
        """The content hashes of the part's sources (None: it has none)."""
        return self._pread(*self.side) if self.side is not None else None

    def _pread(self, offset: int, size: int) -> bytes:
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), size, offset)
        if len(data) != size:
            raise CorruptStoreError(f"{self.where!r} is shorter than its header says", self.where)
        return data


def _layout(
    doc: dict[str, Any], part: str, where: str, start: int
) -> tuple[dict[str, tuple[int, int]], tuple[int, int] | None, int]:
    """Offsets and sizes of the files and the side file a bundle header lists, and where
    the bundle ends."""
    listed, side = doc.get("files"), doc.get("source_xxh3")
    if doc.get("part") != part or not isinstance(listed, list) or not listed or not (
            side is None or (type(side) is int and side >= 0)):
        raise CorruptStoreError(f"{where!r}: its header is not that of part {part!r}", where)
    files: dict[str, tuple[int, int]] = {}
    offset = start
    for entry in listed:
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str)
                or type(entry[1]) is not int or entry[1] < 0 or not _safe(entry[0])
                or entry[0] in files):
            raise CorruptStoreError(f"{where!r}: bad file entry {str(entry)[:200]} in its header",
                                    where)
        files[entry[0]] = (offset, entry[1])
        offset += entry[1]
    if listed[0][0] != GROUP:
        raise CorruptStoreError(f"{where!r}: its first file is not the group {GROUP}", where)
    if side is None:
        return files, None, offset
    return files, (offset, side), offset + side


def _safe(rel: str) -> bool:
    """Whether ``rel`` is a plain relative path inside a store."""
    return (bool(rel) and not rel.startswith("/") and "\\" not in rel and "\0" not in rel
            and posixpath.normpath(rel) == rel and not rel.startswith(".."))
