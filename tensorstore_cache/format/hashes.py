"""The content hashes of a part's sources: the ``<part>.source_xxh3`` side file.

A part built with ``check="hash"`` records an XXH3-64 of every source's bytes
in a file next to the part directory: ``n`` little-endian ``uint64`` in row
order, ``0`` meaning "unknown". It lies outside the store directory, so the
store itself stays exactly what every build writes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError
from ..fs.durable import fsync_dir, write_bytes_durable

__all__ = ["HASH_SUFFIX", "hashes_path", "read_hashes", "write_hashes"]

#: Suffix of the side file holding the content hashes of a part.
HASH_SUFFIX = ".source_xxh3"


def hashes_path(root: Path) -> Path:
    """Return the hash side file of the part at ``root``."""
    return root.with_name(root.name + HASH_SUFFIX)


def write_hashes(root: Path, hashes: npt.NDArray[np.uint64]) -> None:
    """Write the hash side file of the part at ``root`` (hashes in row order), durably."""
    write_bytes_durable(hashes_path(root), np.ascontiguousarray(hashes, "<u8").tobytes())
    fsync_dir(root.parent)


def read_hashes(root: Path, n: int) -> npt.NDArray[np.uint64] | None:
    """Return the recorded content hashes of the ``n`` rows of the part at ``root``, or None.

    Raises
    ------
    CorruptStoreError
        If the side file cannot be read or does not hold ``n`` hashes.
    """
    path = hashes_path(root)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CorruptStoreError(f"{path} cannot be read: {exc}", str(path)) from None
    if len(raw) != 8 * n:
        raise CorruptStoreError(
            f"{path} is {len(raw)} bytes but its part holds {n} entries "
            f"({8 * n} bytes expected); delete it (its entries fall back to stat checks)",
            str(path),
        )
    return np.frombuffer(raw, "<u8").astype(np.uint64)
