"""Opening a store: a location describes its segments, the reader assembles the store.

Every way of opening a store ends here. The layer that knows a kind of
location (a store directory here, a cache namespace's parts in
:mod:`tensorstore_cache.cache`, a remote store's copy in the node cache in
:mod:`tensorstore_cache.remote`) turns it into :class:`SegmentSource`
descriptions; :func:`assemble` alone maps the segments, checks them, numbers
their live rows and builds the :class:`~tensorstore_cache.reader.store.CacheStore`.

A location is a frozen, picklable value resolved once
(:class:`~tensorstore_cache.reader.store.Location`): a store pickles as its
location and unpickles by opening it again, so another process maps the same
files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError, StoreNotFoundError
from ..format import (
    FIELDS,
    FORMAT_VERSION,
    RECORDS_VERSION,
    Field,
    FieldLayout,
    GroupMetadata,
    StoreSpec,
    canonical_json,
    schema_to_json,
)
from ..fs import Trust
from .segment import Segment
from .store import CacheStore, Location
from .supply import ShardSupply

__all__ = ["MadeBy", "SegmentSource", "StoreDirectory", "assemble", "open_directory"]


@dataclass(frozen=True, slots=True)
class MadeBy:
    """What made the vectors of a store: checked on every segment of a cache namespace."""

    loader_id: str
    loader_params: dict[str, Any]
    dtype: str
    format_version: int = FORMAT_VERSION
    item_shape: tuple[int, ...] | None = None
    """Of a store with no segment yet (None: unknown)."""
    schema: tuple[tuple[str, Field], ...] | None = None
    """The fields a namespace of records declared (None: not declared)."""

    def made(self, spec: StoreSpec) -> bool:
        """Whether ``spec`` describes vectors (or records) made this way.

        A namespace of one tensor per key also takes records of a schema
        inferred from its loader; a namespace of declared fields takes only
        records of those fields.
        """
        same_loader = (
            spec.loader_id == self.loader_id
            and canonical_json(spec.loader_params) == canonical_json(self.loader_params)
        )
        if spec.records:
            return same_loader and (self.schema is None or spec.schema == self.schema)
        return (
            same_loader and self.format_version == FORMAT_VERSION
            and spec.format_version == FORMAT_VERSION and spec.dtype == self.dtype
        )

    def empty_spec(self) -> StoreSpec:
        """The spec of a store of no rows made this way."""
        if self.schema is not None:
            layouts = tuple(FieldLayout(name, f, 0, path=f"{FIELDS}/{name}")
                            for name, f in self.schema)
            return StoreSpec(
                n=0, item_shape=None, dtype=None, loader_id=self.loader_id,
                loader_params=self.loader_params, format_version=RECORDS_VERSION,
                fields=layouts,
            )
        return StoreSpec(
            n=0,
            item_shape=self.item_shape if self.item_shape is not None else (0,),
            dtype=self.dtype,
            loader_id=self.loader_id,
            loader_params=self.loader_params,
            format_version=self.format_version,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentSource:
    """One store directory of a store, as the layer that knows its location describes it."""

    root: Path
    """The store directory."""
    trust: Trust
    """Whose directories and files may be read (see :mod:`tensorstore_cache.fs.trust`)."""
    parent_fd: int | None = None
    """A checked descriptor of the directory holding ``root``: ``root`` is then opened in it by
    name, never through a symlink. None: ``root`` is opened by its path."""
    supply: Callable[[GroupMetadata], ShardSupply] | None = None
    """Makes the supply of shards fetched on demand, from the segment's metadata (read once)."""
    hashes: Callable[[int], npt.NDArray[np.uint64] | None] | None = None
    """Reads the recorded content hashes of the segment's ``n`` sources, at open (None: none
    kept)."""
    pin: bool = False
    """Map every shard now: the store then needs none of its files again."""
    resources: Sequence[Any] = field(default=())
    """Closed with the store (e.g. a reader's hold on the directory)."""


@dataclass(frozen=True, slots=True)
class StoreDirectory:
    """A store directory named by its path (:func:`open_directory`)."""

    path: str
    trust: Trust

    @property
    def shown(self) -> str:
        """The directory."""
        return self.path

    def open(self) -> CacheStore:
        """Open it (one segment)."""
        root = Path(self.path)
        if not root.is_dir():
            raise StoreNotFoundError(
                f"no store at {self.path!r}; build one with tensorstore_cache.build_store "
                "(or check the path)"
            )
        return assemble(self, [SegmentSource(root=root, trust=self.trust)])


def open_directory(path: str | os.PathLike[str], *, trust: Trust | None = None) -> CacheStore:
    """Open the store directory ``path`` (one segment) read-only.

    Parameters
    ----------
    path
        A store directory written by a build.
    trust
        Whose directories and files may be read (default: a store the user
        names, warned about when others can write it).

    Raises
    ------
    StoreNotFoundError
        If there is no directory at ``path``.
    CorruptStoreError
        If its metadata is invalid.
    """
    where = os.fspath(path)
    return StoreDirectory(where, trust if trust is not None else Trust.explicit(where)).open()


def assemble(
    where: Location,
    sources: Sequence[SegmentSource],
    *,
    identity: MadeBy | None = None,
    resources: Sequence[Any] = (),
) -> CacheStore:
    """Open the segments ``sources`` describe (oldest first) as one store at ``where``.

    Parameters
    ----------
    where
        The store's location (how it pickles).
    sources
        Its segments; later ones override earlier ones for the same key.
    identity
        What must have made every segment (a cache namespace's loader), and
        the spec of a store without segments.
    resources
        Closed with the store, after its segments.

    Raises
    ------
    StoreNotFoundError
        If a segment's directory is missing.
    CorruptStoreError
        If a segment's metadata is invalid, or it was not made as ``identity``
        says, or segments hold items of different shapes.
    """
    segments: list[Segment] = []
    owned: list[Any] = []
    try:
        for source in sources:
            owned.extend(source.resources)
            seg = Segment(source.root, trust=source.trust, parent_fd=source.parent_fd,
                          supply=source.supply, hashes=source.hashes)
            segments.append(seg)
            if identity is not None and not identity.made(seg.spec):
                made = seg.spec
                raise CorruptStoreError(
                    f"{str(seg.root)!r} was made by {made.loader_id!r} {made.loader_params} "
                    f"{made.dtype}, not by what {where.shown!r} holds; the cache directory is "
                    f"damaged - remove {where.shown!r}",
                    str(seg.root),
                )
            if source.pin:  # everything the store reads later, read now: it survives a gc
                seg.map_all()
        shapes = {_shape(seg.spec) for seg in segments} if len(segments) > 1 else set()
        if len(shapes) > 1:
            raise CorruptStoreError(
                f"the segments of {where.shown!r} hold items of different shapes "
                f"{sorted(shapes)}; the loader changed its output without a new loader_id - "
                "give it a new loader_id (or remove the cache namespace)",
                str(segments[-1].root),
            )
    except BaseException:
        for seg in segments:
            seg.close()
        for res in [*owned, *resources]:
            res.close()
        raise
    if not segments:
        if identity is None:
            raise ValueError(f"a store at {where.shown!r} without segments needs an identity")
        spec: StoreSpec | None = identity.empty_spec()
    else:
        spec = segments[0].spec if len(segments) == 1 else None  # combined when first asked
    return CacheStore(segments, where, spec=spec, resources=[*owned, *resources])


def _shape(spec: StoreSpec) -> str:
    """What every segment of one store must agree on: the item shape, or the fields."""
    if spec.records:
        return "fields " + canonical_json(schema_to_json(spec.schema))
    return str(spec.item_shape)
