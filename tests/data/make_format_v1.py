"""Write ``tests/data/format_v1/``: stores and a cache namespace of on-disk format 1.

Run once, from the checkout's root, with the code that writes format 1::

    .venv/bin/python -m tests.data.make_format_v1

It writes the sources (``format_v1/sources/``, deterministic bytes), then,
with the working directory at ``format_v1/`` (keys are relative paths, as
users write them), only through the public API:

- ``float32.store/``: :func:`~tensorstore_cache.build_store` of the seven
  ``sources/rows/*.bin`` with :class:`RawLoader` ``float32`` of shape
  ``(3,)``, ``on_error="skip"`` (``bad.bin`` is 5 bytes, not a row: one
  skipped row), three rows per shard (two shards);
- ``uint8.store/``: the same sources as ``uint8`` of shape ``(3, 2, 2)``,
  one shard, ``bad.bin`` skipped too;
- ``cache/<namespace>/``: two :func:`~tensorstore_cache.cached` calls. The
  first computes ``a``, ``b`` and ``c`` (``c.bin`` holding ``c.first``); then
  ``c.bin`` gets the bytes of ``c.second`` and a later mtime, and the second
  call (``identity="content"``) computes ``c`` again and ``d`` into a second part
  that overrides the first for ``c`` and has a ``.source_xxh3`` side file.
  Two manifests, generations 1 and 2.

Every source's ``mtime_ns`` is set to a fixed old value (:data:`FIRST_NS`,
:data:`SECOND_NS` for ``c.bin`` at the second call) before each build, so
that nothing is racily clean (no content hash recorded for that reason) and
every recorded identity is the same on every run. ``tests/test_guarantees/test_format_v1.py``
reads these files with the current reader and rebuilds them with
:func:`build_all` to check that the writer still writes them byte for byte
(but for build times, part ids and the manifests' writer).

From now on a change of the on-disk format needs a new format version, and
the reader keeps reading these files.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

import tensorstore_cache as tsc

__all__ = [
    "DATA",
    "FIRST_NS",
    "FLOAT32_LOADER",
    "NAMESPACE_LOADER",
    "ROW_KEYS",
    "SECOND_NS",
    "SKIPPED",
    "UINT8_LOADER",
    "RawLoader",
    "build_all",
    "write_sources",
]

#: The committed data.
DATA = Path(__file__).resolve().parent / "format_v1"
#: ``mtime_ns`` of every source at the builds (2020-09-13T12:26:40Z).
FIRST_NS = 1_600_000_000_000_000_000
#: ``mtime_ns`` of ``sources/ns/c.bin`` once it holds ``c.second``: a day later.
SECOND_NS = FIRST_NS + 86_400 * 10**9

#: The paths of both stores, in row order; ``bad.bin`` fails and is skipped.
ROW_KEYS = (
    "sources/rows/r0.bin",
    "sources/rows/r1.bin",
    "sources/rows/r2.bin",
    "sources/rows/bad.bin",
    "sources/rows/r3.bin",
    "sources/rows/r4.bin",
    "sources/rows/r5.bin",
)
#: The path that fails to load.
SKIPPED = "sources/rows/bad.bin"
#: The keys of the two calls of ``cached()``.
FIRST_CALL = ("sources/ns/a.bin", "sources/ns/b.bin", "sources/ns/c.bin")
SECOND_CALL = ("sources/ns/b.bin", "sources/ns/c.bin", "sources/ns/d.bin")


@dataclass(frozen=True, slots=True)
class RawLoader:
    """Read a source's bytes as one little-endian row of ``item_shape`` and ``dtype``.

    A source of any other length fails with a :class:`ValueError` naming it.
    """

    dtype: str
    item_shape: tuple[int, ...]
    loader_id: ClassVar[str] = "tests.format_v1.raw/1"

    @property
    def params(self) -> dict[str, Any]:
        """The parameters recorded in every store (and the cache's fingerprint)."""
        return {"dtype": self.dtype, "item_shape": list(self.item_shape)}

    def __call__(self, path: str) -> npt.NDArray[Any]:
        raw = Path(path).read_bytes()
        dtype = np.dtype(self.dtype).newbyteorder("<")
        nbytes = math.prod(self.item_shape) * dtype.itemsize
        if len(raw) != nbytes:
            raise ValueError(f"{path} holds {len(raw)} bytes, a row is {nbytes}")
        return np.frombuffer(raw, dtype=dtype).reshape(self.item_shape).astype(self.dtype)


FLOAT32_LOADER = RawLoader("float32", (3,))
UINT8_LOADER = RawLoader("uint8", (3, 2, 2))
NAMESPACE_LOADER = RawLoader("float32", (3,))


def _row(values: list[float]) -> bytes:
    return np.array(values, dtype="<f4").tobytes()


def write_sources(root: Path) -> None:
    """Write the source files under ``root/sources`` (12 bytes a row, ``bad.bin`` 5)."""
    rows = root / "sources" / "rows"
    ns = root / "sources" / "ns"
    rows.mkdir(parents=True)
    ns.mkdir(parents=True)
    values = [
        [0.0, -0.0, 1.0],
        [0.1, -2.5, 3.0e38],
        [float("inf"), float("-inf"), float("nan")],
        [1.0e-45, -1.17549435e-38, 65504.0],  # a subnormal, the smallest normal, fp16 max
        [255.0, 0.003921569, -1.0],
        [1.0 / 3.0, 2.0 / 3.0, 1.0e7],
    ]
    for i, row in enumerate(values):
        (rows / f"r{i}.bin").write_bytes(_row(row))
    (rows / "bad.bin").write_bytes(b"short")
    (ns / "a.bin").write_bytes(_row([1.5, 2.5, 3.5]))
    (ns / "b.bin").write_bytes(_row([-1.0, -2.0, -3.0]))
    (ns / "c.first").write_bytes(_row([10.0, 20.0, 30.0]))
    (ns / "c.second").write_bytes(_row([11.0, 21.0, 31.0]))
    shutil.copyfile(ns / "c.second", ns / "c.bin")
    (ns / "d.bin").write_bytes(_row([0.25, 0.5, 0.75]))


def _set_mtimes(root: Path, ns: int) -> None:
    for path in sorted((root / "sources").rglob("*")):
        if path.is_file():
            os.utime(path, ns=(ns, ns))


@contextmanager
def _cwd(path: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def build_all(root: Path) -> None:
    """Build ``float32.store``, ``uint8.store`` and ``cache/`` in ``root`` from ``root/sources``.

    ``root/sources/ns/c.bin`` ends holding the bytes of ``c.second``.
    """
    ns = root / "sources" / "ns"
    _set_mtimes(root, FIRST_NS)
    with _cwd(root):
        for name, loader, shard_bytes in (
            ("float32.store", FLOAT32_LOADER, 3 * 12),
            ("uint8.store", UINT8_LOADER, 32 << 20),
        ):
            tsc.build_store(
                list(ROW_KEYS), name, loader=loader, dtype=loader.dtype, on_error="skip",
                workers=1, progress=False, shard_bytes=shard_bytes,
            ).close()
        shutil.copyfile(ns / "c.first", ns / "c.bin")
        os.utime(ns / "c.bin", ns=(FIRST_NS, FIRST_NS))
        tsc.cached(list(FIRST_CALL), cache_dir=root / "cache", loader=NAMESPACE_LOADER,
                   workers=1, progress=False).close()
        shutil.copyfile(ns / "c.second", ns / "c.bin")
        os.utime(ns / "c.bin", ns=(SECOND_NS, SECOND_NS))
        tsc.cached(list(SECOND_CALL), cache_dir=root / "cache", loader=NAMESPACE_LOADER,
                   workers=1, progress=False, identity="content").close()


def main() -> None:
    """Write the committed data once; refuse to overwrite it."""
    if DATA.exists():
        sys.exit(f"{DATA} exists: format 1 is written once; delete it only to start over")
    DATA.mkdir(parents=True)
    write_sources(DATA)
    build_all(DATA)
    print(f"wrote {DATA}")


if __name__ == "__main__":
    main()
