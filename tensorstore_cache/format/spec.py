"""The description of a store: :class:`StoreSpec`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORMAT_VERSION", "StoreSpec"]

#: Version of the on-disk format written by this release.
FORMAT_VERSION = 1


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
    item_shape: tuple[int, ...]
    """Shape of one vector, e.g. ``(3, 32, 32)``."""
    dtype: str
    """NumPy name of the element type, e.g. ``"float32"`` or ``"uint8"``."""
    loader_id: str
    """Identifier of the function that produced the vectors."""
    loader_params: dict[str, Any]
    """Parameters of that function (JSON values), e.g. ``{"size": [32, 32], ...}``."""
    format_version: int = FORMAT_VERSION
    """On-disk format version."""
    rows_per_shard: int = 1
    """Vectors per shard file."""
    skipped: tuple[tuple[str, str], ...] = field(default=())
    """Sources left out by ``on_error="skip"``, as ``(path, reason)``."""
    created_unix: float = 0.0
    """Build time, seconds since the epoch."""

    @property
    def item_nbytes(self) -> int:
        """Bytes of one vector."""
        from numpy import dtype, prod

        return int(prod(self.item_shape, dtype="int64")) * dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        """Return the spec as JSON values (as stored in the group attributes)."""
        return {
            "format_version": self.format_version,
            "n": self.n,
            "item_shape": list(self.item_shape),
            "dtype": self.dtype,
            "loader_id": self.loader_id,
            "loader_params": self.loader_params,
            "rows_per_shard": self.rows_per_shard,
            "skipped": [list(s) for s in self.skipped],
            "created_unix": self.created_unix,
        }
