"""Sources copied to each machine: the stats a node found to hold the bytes recorded elsewhere.

A namespace shared through ``remote=`` records a content hash of every source
(XXH3-64, taken before its read) beside its size and mtime. A node whose own
copy of a source has another mtime (``cp``, ``aws s3 sync``, a container
layer) reads it once, compares the hash, and on a match keeps the vector and
remembers here, in its node namespace, that this stat holds those bytes: its
next call only stats. A source whose bytes differ is stale on that node.

The file ``seen_sources.npz`` of the node's namespace directory: arrays
``keys`` (the keys, UTF-8, separated by NUL, which no key holds), ``size``,
``mtime_ns`` (int64) and ``xxh3`` (uint64), one entry per key, and
``version`` (1). Written whole by an atomic replace with the cache's modes;
two processes writing at once may lose one's entries, which costs only a
read of those sources later. Read with ``allow_pickle=False``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import CorruptStoreError
from .namespace import Namespace

__all__ = ["NodeSeenSources"]

FILE = "seen_sources.npz"
_VERSION = 1
#: Largest file read (some 3 million keys of 100 bytes).
_MAX_BYTES = 1 << 30

_Entry = tuple[int, int, int]


class NodeSeenSources:
    """The :class:`~tensorstore_cache.reader.SeenSources` of one node namespace.

    Read on first use; what :meth:`learn` adds is written by :meth:`save`.
    """

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns
        self._known: dict[str, _Entry] | None = None
        self._new: dict[str, _Entry] = {}

    def _load(self) -> dict[str, _Entry]:
        if self._known is None:
            raw = self.ns.read_file(FILE, _MAX_BYTES)
            self._known = _decode(raw, str(self.ns.root / FILE)) if raw is not None else {}
        return self._known

    def lookup(
        self, keys: Sequence[str]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
        """``(size, mtime_ns, content hash)`` this node saw of every key (``-1, -1, 0``: none)."""
        known = self._load()
        rows = [known.get(k, (-1, -1, 0)) for k in keys]
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint64)
        size, mtime, digest = zip(*rows, strict=True)
        return np.array(size, np.int64), np.array(mtime, np.int64), np.array(digest, np.uint64)

    def learn(
        self, keys: Sequence[str], size: npt.NDArray[np.int64], mtime_ns: npt.NDArray[np.int64],
        content_hash: npt.NDArray[np.uint64],
    ) -> None:
        """Remember that these keys held these bytes at this stat (written by :meth:`save`)."""
        for key, s, m, h in zip(keys, size.tolist(), mtime_ns.tolist(), content_hash.tolist(),
                                strict=True):
            self._new[key] = (int(s), int(m), int(h))

    def save(self) -> None:
        """Write what was learnt, merged with what the file holds now (no-op if nothing)."""
        if not self._new:
            return
        raw = self.ns.read_file(FILE, _MAX_BYTES)
        merged = _decode(raw, str(self.ns.root / FILE)) if raw is not None else {}
        merged.update(self._new)
        self.ns.replace_file(FILE, _encode(merged))
        self._known, self._new = merged, {}


def _encode(entries: dict[str, _Entry]) -> bytes:
    keys = list(entries)
    rows = [entries[k] for k in keys]
    buf = io.BytesIO()
    np.savez(buf, version=np.array(_VERSION), keys=np.frombuffer(
        "\0".join(keys).encode("utf-8", "surrogatepass"), np.uint8),
        size=np.array([r[0] for r in rows], np.int64),
        mtime_ns=np.array([r[1] for r in rows], np.int64),
        xxh3=np.array([r[2] for r in rows], np.uint64))
    return buf.getvalue()


def _decode(raw: bytes, where: str) -> dict[str, _Entry]:
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            if int(z["version"]) != _VERSION:
                raise ValueError(f"version {int(z['version'])}")
            blob = z["keys"].tobytes().decode("utf-8", "surrogatepass")
            size, mtime = z["size"].astype(np.int64), z["mtime_ns"].astype(np.int64)
            digest = z["xxh3"].astype(np.uint64)
    except (ValueError, KeyError, OSError, EOFError) as exc:
        raise CorruptStoreError(f"{where} is damaged ({exc}); delete it (it only saves "
                                "reading sources again)", where) from None
    keys = blob.split("\0") if blob else []
    if not (len(keys) == len(size) == len(mtime) == len(digest)):
        raise CorruptStoreError(f"{where} is damaged (lengths differ); delete it", where)
    return dict(zip(keys, zip(size.tolist(), mtime.tolist(), digest.tolist(), strict=True),
                    strict=True))
