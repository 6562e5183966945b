"""One contiguous virtual array over many shard files (Linux).

A store's shards are separate files, but a batch gather is fastest as one
``numpy.take`` over one array. This module reserves an address range for all
rows of a store (``PROT_NONE``, no memory committed) and maps each shard's
data region copy-on-write into its slot with ``MAP_FIXED``, so the rows of
every shard form one C-contiguous ``(n, *item_shape)`` array. Slots are
mapped on first use; touching a slot that is not mapped yet would fault, so
callers map every shard they read first (:meth:`VirtualRows.ensure`).

The range is unmapped only when no numpy view of it remains.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["VirtualRows", "virtual_rows_supported"]

_PAGE = mmap.PAGESIZE
#: A range of at least a huge page starts on one (2 MiB: Linux's, with 4 KiB pages), so that
#: a shard of whole huge pages sits on them and the kernel maps the page cache's huge pages
#: whole (the builder lays shards so: writer/layout.py).
_HUGE = 2 << 20
_MAP_FIXED = 0x10  # identical on Linux and the BSDs

_libc: Any = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_long,
        ]
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        _libc = None


def virtual_rows_supported(rows_per_shard: int, item_nbytes: int) -> bool:
    """Whether shards of this geometry can be laid side by side in memory."""
    return _libc is not None and (rows_per_shard * item_nbytes) % _PAGE == 0 and item_nbytes > 0


class _Range:
    """The reserved range as numpy sees it: writable rows (the shards are mapped
    copy-on-write), whose base holds the mmap object that unmaps the range (and every
    shard mapped into it) when the last array over it goes."""

    __slots__ = ("__array_interface__", "_mapping")

    def __init__(self, mapping: mmap.mmap, address: int, shape: tuple[int, ...], typestr: str):
        self._mapping = mapping
        self.__array_interface__ = {"version": 3, "data": (address, False), "shape": shape,
                                    "typestr": typestr}


class VirtualRows:
    """An ``(n, *item_shape)`` array whose slots are backed by shard files.

    Parameters
    ----------
    n, item_shape, dtype
        Shape and type of the whole array.
    rows_per_shard
        Rows per shard; ``rows_per_shard * item_nbytes`` must be a multiple of
        the page size (see :func:`virtual_rows_supported`).
    """

    def __init__(
        self, n: int, item_shape: tuple[int, ...], dtype: np.dtype[Any], rows_per_shard: int
    ) -> None:
        self.item_nbytes = math.prod(item_shape) * dtype.itemsize
        self.rows_per_shard = rows_per_shard
        self.length = max(_PAGE, -(-n * self.item_nbytes // _PAGE) * _PAGE)
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_NORESERVE", 0)
        extra = _HUGE if self.length >= _HUGE else 0
        reserved = mmap.mmap(-1, self.length + extra, flags=flags, prot=0)  # PROT_NONE
        start: int = np.frombuffer(reserved, np.uint8, 1).__array_interface__["data"][0]
        self.address: int = -(-start // _HUGE) * _HUGE if extra else start
        self.rows: npt.NDArray[Any] = np.asarray(
            _Range(reserved, self.address, (n, *item_shape), dtype.str))
        self.mapped = np.zeros(-(-n // rows_per_shard) if n else 0, dtype=bool)

    def map_shard(self, k: int, fd: int, rows: int) -> None:
        """Map the first ``rows`` rows of shard file ``fd`` into slot ``k``."""
        length = rows * self.item_nbytes
        target = self.address + k * self.rows_per_shard * self.item_nbytes
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        address = _libc.mmap(target, length, prot, mmap.MAP_PRIVATE | _MAP_FIXED, fd, 0)
        if address != target:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot map shard {k}: {os.strerror(err)}")
        self.mapped[k] = True

    def unmap_shard(self, k: int) -> None:
        """Give slot ``k`` back: ``PROT_NONE`` again, the shard file no longer mapped.

        The caller guarantees that nothing reads the slot meanwhile and that
        no view of it was handed out (stores that release shards return copies).
        """
        offset = k * self.rows_per_shard * self.item_nbytes
        length = min(self.rows_per_shard * self.item_nbytes, self.length - offset)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0) | _MAP_FIXED
        address = _libc.mmap(self.address + offset, length, 0, flags, -1, 0)
        if address != self.address + offset:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot release shard {k}: {os.strerror(err)}")
        self.mapped[k] = False
