"""The content hashes of a part's sources: the ``<part>.source_xxh3`` side file.

A part built with ``identity="content"`` records an XXH3-64 of every source's bytes
in a file next to the part directory: ``n`` little-endian ``uint64`` in row
order, ``0`` meaning "unknown". It lies outside the store directory, so the
store itself stays exactly what every build writes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError, UntrustedCacheError
from ..fs import EXPLICIT, Trust, fsync_dir, open_file, write_bytes_durable

__all__ = ["HASH_SUFFIX", "hashes_path", "read_hashes", "write_hashes"]

#: Suffix of the side file holding the content hashes of a part.
HASH_SUFFIX = ".source_xxh3"


def hashes_path(root: Path) -> Path:
    """Return the hash side file of the part at ``root``."""
    return root.with_name(root.name + HASH_SUFFIX)


def write_hashes(
    root: Path, hashes: npt.NDArray[np.uint64], *, trust: Trust | None = None
) -> None:
    """Write the hash side file of the part at ``root`` (hashes in row order), durably.

    It gets the file mode of ``trust`` (the cache's).
    """
    write_bytes_durable(
        hashes_path(root), np.ascontiguousarray(hashes, "<u8").tobytes(), trust=trust
    )
    fsync_dir(root.parent)


def read_hashes(
    root: Path, n: int, *, trust: Trust | None = None, dir_fd: int | None = None
) -> npt.NDArray[np.uint64] | None:
    """Return the recorded content hashes of the ``n`` rows of the part at ``root``, or None.

    Parameters
    ----------
    root
        The part directory.
    n
        Its rows.
    trust
        Checked on the side file opened (default: warn only, see
        :func:`~tensorstore_cache.fs.trust.check_stat`).
    dir_fd
        A checked descriptor of the directory holding the part: the side
        file is opened in it.

    Raises
    ------
    CorruptStoreError
        If the side file cannot be read or does not hold ``n`` hashes.
    UntrustedCacheError
        If it fails ``trust``.
    """
    path = hashes_path(root)
    try:
        fd = open_file(path.name if dir_fd is not None else path, trust or EXPLICIT,
                       dir_fd=dir_fd, shown=path)
    except FileNotFoundError:
        return None
    except UntrustedCacheError:
        raise
    except OSError as exc:
        raise CorruptStoreError(f"{path} cannot be read: {exc}", str(path)) from None
    try:
        size = os.fstat(fd).st_size
        if size != 8 * n:
            raise CorruptStoreError(
                f"{path} is {size} bytes but its part holds {n} entries "
                f"({8 * n} bytes expected); delete it (its entries fall back to stat checks)",
                str(path),
            )
        raw = os.pread(fd, size, 0) if size else b""
    finally:
        os.close(fd)
    if len(raw) != size:
        raise CorruptStoreError(f"{path} changed size while being read", str(path))
    return np.frombuffer(raw, "<u8").astype(np.uint64)
