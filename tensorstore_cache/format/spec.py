"""The description of a store: :class:`StoreSpec`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..config import Recorded
from .fields import Field, FieldLayout, Fixed

__all__ = ["FORMAT_VERSION", "RECORDS_VERSION", "StoreSpec", "canonical_json"]

FORMAT_VERSION = 1
"""Version of the on-disk format of a store of one fixed-shape tensor per key.

A store of records (named fields per key) is of version 2 (:data:`RECORDS_VERSION`); a
release reads both and refuses any newer version. See the on-disk format page.
"""
RECORDS_VERSION = 2
"""Version of the on-disk format of a store of records (named fields per key)."""


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text of ``value`` (sorted keys, no spaces).

    Examples
    --------
    >>> canonical_json({"b": 1, "a": [1.5, "x"]})
    '{"a":[1.5,"x"],"b":1}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """What a store holds and how it was made.

    Examples
    --------
    >>> spec = StoreSpec(n=2, item_shape=(3, 32, 32), dtype="float32",
    ...                  loader_id="tensorstore_cache.image/1", loader_params={})
    >>> spec.item_nbytes
    12288
    """

    n: int
    """Number of entries (distinct keys)."""
    item_shape: tuple[int, ...] | None
    """Shape of one vector, e.g. ``(3, 32, 32)`` (None for a store of records)."""
    dtype: str | None
    """NumPy name of the element type, e.g. ``"float32"`` or ``"uint8"`` (None for records)."""
    loader_id: str
    """Identifier of the function that produced the vectors."""
    loader_params: dict[str, Any]
    """Parameters of that function (JSON values), e.g. ``{"size": [32, 32], ...}``."""
    format_version: int = FORMAT_VERSION
    """On-disk format version: 1 for one tensor per key, 2 for records."""
    rows_per_shard: int = 1
    """Vectors (or records) per shard file."""
    skipped: tuple[tuple[str, str], ...] = field(default=())
    """Sources left out by ``on_error="skip"``, as ``(path, reason)``."""
    created_unix: float = 0.0
    """Build time, seconds since the epoch."""
    fields: tuple[FieldLayout, ...] = ()
    """The fields of a store of records, in schema order (empty for one tensor per key)."""
    identity: Recorded = "stat"
    """What ``source_size`` and ``source_mtime_ns`` hold: each source's size and mtime taken
    before it was read (``"stat"``), nothing (``"none"``: keys need not be files), or version
    tokens a callable gave (``"token"``, in ``source_mtime_ns``)."""

    @property
    def records(self) -> bool:
        """Whether the store holds records (named fields) rather than one tensor per key."""
        return bool(self.fields)

    @property
    def schema(self) -> tuple[tuple[str, Field], ...]:
        """``(name, field)`` of every field of a store of records (empty otherwise)."""
        return tuple((f.name, f.field) for f in self.fields)

    @property
    def item_nbytes(self) -> int:
        """Bytes of one vector (of a record's fixed fields, for records)."""
        if self.item_shape is None or self.dtype is None:
            return sum(f.row_nbytes for f in self.fields if isinstance(f.field, Fixed))
        from numpy import dtype, prod

        return int(prod(self.item_shape, dtype="int64")) * dtype(self.dtype).itemsize

    def layouts(self) -> tuple[FieldLayout, ...]:
        """Every array of values: the fields of records, or the one ``vectors`` array."""
        if self.fields:
            return self.fields
        assert self.item_shape is not None and self.dtype is not None
        return (FieldLayout("vectors", Fixed(self.item_shape, self.dtype), self.n,
                            rows_per_shard=self.rows_per_shard, path="vectors"),)

    def to_json(self) -> dict[str, Any]:
        """Return the spec as JSON values (as stored in the group attributes)."""
        out: dict[str, Any] = {"format_version": self.format_version, "n": self.n}
        if not self.fields:
            assert self.item_shape is not None
            out.update(item_shape=list(self.item_shape), dtype=self.dtype)
        out.update(
            loader_id=self.loader_id,
            loader_params=self.loader_params,
            rows_per_shard=self.rows_per_shard,
            skipped=[list(s) for s in self.skipped],
            created_unix=self.created_unix,
        )
        if self.fields:
            out["fields"] = [f.to_json() for f in self.fields]
        if self.identity != "stat":  # stores of the default kind stay what every release wrote
            out["source_identity"] = self.identity
        return out
