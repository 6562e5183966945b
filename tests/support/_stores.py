"""Stores assembled from store directories for the reader's own tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tensorstore_cache.fs.trust import Trust
from tensorstore_cache.reader.assembly import SegmentSource, assemble
from tensorstore_cache.reader.store import CacheStore


@dataclasses.dataclass(frozen=True)
class Layered:
    """A location of store directories layered in order (later ones override earlier ones)."""

    roots: tuple[str, ...]

    @property
    def shown(self) -> str:
        return self.roots[-1]

    def open(self) -> CacheStore:
        sources = [SegmentSource(root=Path(r), trust=Trust.explicit(r)) for r in self.roots]
        return assemble(self, sources)


def layered(*roots: Path) -> CacheStore:
    """A store of the store directories ``roots``, later ones overriding earlier ones."""
    return Layered(tuple(str(r) for r in roots)).open()
