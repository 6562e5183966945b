"""The sources of the cache soak test: small files that say which version of which source they are.

A source file is ``MAGIC | sid | version | pad_len | pad | digest``: its
id and version (little-endian ``uint32``), ``pad_len`` bytes of padding
(so that a rewrite may keep the size or change it) and an XXH3-64 of
everything before it (a torn read would be caught). :class:`SourceLoader`
turns it into the float32 vector :func:`expected_vector` of ``(sid,
version)``, which carries both, so a vector returned by the cache can be
checked against the versions the source really had.

Importable by name, so a build's pool workers receive the loader by reference.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
from pathlib import Path

import numpy as np
import numpy.typing as npt
import xxhash

__all__ = [
    "ITEM_LEN",
    "SourceLoader",
    "decode",
    "encode",
    "expected_vector",
    "pad_length",
    "read_version",
    "sid_of",
    "source_name",
    "write_source",
]

MAGIC = b"TSCSOAK\x01"
_HEAD = struct.Struct("<8sIII")
#: Length of a source's vector: ``[sid, version, six check values]``.
ITEM_LEN = 8


def source_name(sid: int) -> str:
    """The file name of source ``sid``."""
    return f"s{sid:06d}.bin"


def sid_of(path: str) -> int:
    """The id of the source at ``path`` (from its file name)."""
    return int(os.path.basename(path)[1:7])


def _pad(sid: int, version: int, n: int) -> bytes:
    seed = xxhash.xxh3_64_digest(f"pad:{sid}:{version}".encode())
    return (seed * (n // len(seed) + 1))[:n]


def encode(sid: int, version: int, pad_len: int) -> bytes:
    """The bytes of source ``sid`` at ``version``, with ``pad_len`` bytes of padding."""
    body = _HEAD.pack(MAGIC, sid, version, pad_len) + _pad(sid, version, pad_len)
    return body + xxhash.xxh3_64_digest(body)


def decode(data: bytes, where: str = "source") -> tuple[int, int]:
    """Return ``(sid, version)`` of a source's bytes; ValueError naming ``where`` if malformed."""
    if len(data) < _HEAD.size + 8:
        raise ValueError(f"{where}: {len(data)} bytes, too short for a soak source")
    magic, sid, version, pad_len = _HEAD.unpack_from(data)
    body, digest = data[:-8], data[-8:]
    if magic != MAGIC or len(data) != _HEAD.size + pad_len + 8:
        raise ValueError(f"{where}: not a soak source (bad magic or length {len(data)})")
    if xxhash.xxh3_64_digest(body) != digest or body[_HEAD.size:] != _pad(sid, version, pad_len):
        raise ValueError(f"{where}: checksum mismatch (a torn read of sid {sid} v{version}?)")
    return sid, version


def pad_length(data: bytes) -> int:
    """The padding length of a source's bytes (its size is ``pad_length + 28``)."""
    return int(_HEAD.unpack_from(data)[3])


def expected_vector(sid: int, version: int) -> npt.NDArray[np.float32]:
    """The vector of source ``sid`` at ``version``: ``[sid, version, six check values]``.

    Every value is an integer below 2**24, exact in float32.
    """
    h = xxhash.xxh3_128_intdigest(f"vec:{sid}:{version}".encode())
    checks = [(h >> (16 * k)) & 0xFFFF for k in range(ITEM_LEN - 2)]
    return np.array([sid, version, *checks], dtype=np.float32)


def read_version(path: str) -> int:
    """The version of the source file at ``path`` now (read whole, as the loader does)."""
    with open(path, "rb") as f:
        return decode(f.read(), path)[1]


def write_source(
    root: Path, sid: int, version: int, pad_len: int, *, mtime_ns: int | None = None
) -> os.stat_result:
    """Atomically (re)write source ``sid`` at ``version``; return the new file's stat.

    The bytes go to a hidden temporary file of ``root`` that then replaces
    the source with one ``os.replace``, so a reader sees the old file or the
    new one, whole. With ``mtime_ns`` the new file gets that modification
    time before it replaces the old one (a rewrite within one timestamp
    tick of a coarse-grained filesystem).
    """
    path = root / source_name(sid)
    tmp = root / f".{source_name(sid)}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(encode(sid, version, pad_len))
    if mtime_ns is not None:
        os.utime(tmp, ns=(time.time_ns(), mtime_ns))
    os.replace(tmp, path)
    return os.stat(path)


class SourceLoader:
    """The soak test's loader: a source file's bytes to :func:`expected_vector` of its (sid, version).

    It declares no ``item_shape``, so the first build of a namespace probes
    its first item; ``delay`` seconds per item make builds last long enough
    to be interrupted. It has no ``params``: callers name it by ``loader_id``.
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def __call__(self, path: str) -> npt.NDArray[np.float32]:
        with open(path, "rb") as f:
            data = f.read()
        if self.delay:
            time.sleep(self.delay)
        sid, version = decode(data, path)
        return expected_vector(sid, version)
