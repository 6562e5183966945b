"""Write ``tests/data/remote_v1/``: a cluster's namespace of remote layout version 1.

Run once, from the checkout's root, with the code that writes remote layout 1::

    .venv/bin/python -m tests.data.make_remote_v1

It writes the sources (``remote_v1/sources/``, 12 bytes a row, as for format 1),
then, with the working directory at ``remote_v1/`` (keys are relative paths),
only through the public API, two :func:`~tensorstore_cache.cached` calls of two
nodes (each with its own node cache, in a temporary directory: not kept) sharing
``remote_v1/remote/``, a shared directory (the objects are the same bytes on S3):

- node 0 computes ``a``, ``b`` and ``c`` and skips ``bad`` (``on_error="skip"``;
  5 bytes, not a row): generation 1, one part;
- node 1 asks for ``c``, ``d`` and ``e`` and computes ``d`` and ``e``: generation
  2, two parts.

So ``remote/`` holds every kind of object: two manifests (the first lists the
skipped key), the head hint, two parts (stores of format 1, with their
sources' content hashes) and their bundles, two released leases, and the two
store probes. Every source's ``mtime_ns`` is :data:`FIRST_NS`, so nothing is
racily clean. ``tests/test_remote/test_remote_format.py`` reads these objects
with the current reader and rebuilds them with :func:`build_all` to check that
the writer still writes them (but for tokens, part ids, build times, hosts and
pids).

From now on a change of these objects needs a new remote layout version, and
the reader keeps reading these files.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import ClassVar

import numpy as np

import tensorstore_cache as tsc

from .make_format_v1 import FIRST_NS, RawLoader, _cwd, _set_mtimes

__all__ = ["DATA", "FIRST_CALL", "FIRST_NS", "LOADER", "SECOND_CALL", "SKIPPED", "build_all",
           "write_sources"]

#: The committed data.
DATA = Path(__file__).resolve().parent / "remote_v1"
#: The keys of node 0's call; ``bad`` fails and is skipped.
FIRST_CALL = ("sources/a.bin", "sources/b.bin", "sources/c.bin", "sources/bad.bin")
#: The keys of node 1's call.
SECOND_CALL = ("sources/c.bin", "sources/d.bin", "sources/e.bin")
#: The key that fails to load.
SKIPPED = "sources/bad.bin"


class RemoteRawLoader(RawLoader):
    """:class:`~tests.data.make_format_v1.RawLoader` under a loader id of its own."""

    loader_id: ClassVar[str] = "tests.remote_v1.raw/1"


LOADER = RemoteRawLoader("float32", (3,))


def write_sources(root: Path) -> None:
    """Write the source files under ``root/sources`` (12 bytes a row, ``bad.bin`` 5)."""
    sources = root / "sources"
    sources.mkdir(parents=True)
    rows = {"a": [1.5, 2.5, 3.5], "b": [-1.0, -2.0, -3.0], "c": [10.0, 20.0, 30.0],
            "d": [0.25, 0.5, 0.75], "e": [float("inf"), -0.0, 1.0e-45]}
    for name, row in rows.items():
        (sources / f"{name}.bin").write_bytes(np.array(row, dtype="<f4").tobytes())
    (sources / "bad.bin").write_bytes(b"short")


def build_all(root: Path) -> None:
    """Build ``remote/`` in ``root`` from ``root/sources`` by two nodes' calls."""
    _set_mtimes(root, FIRST_NS)
    remote = root / "remote"
    remote.mkdir()
    with tempfile.TemporaryDirectory() as nodes, _cwd(root):
        for n, keys in enumerate((FIRST_CALL, SECOND_CALL)):
            tsc.cached(list(keys), cache_dir=Path(nodes) / f"node{n}", remote=str(remote),
                       loader=LOADER, on_error="skip", workers=1, progress=False).close()


def main() -> None:
    """Write the committed data once; refuse to overwrite it."""
    if DATA.exists():
        sys.exit(f"{DATA} exists: remote layout 1 is written once; delete it only to start over")
    DATA.mkdir(parents=True)
    try:
        write_sources(DATA)
        build_all(DATA)
    except BaseException:
        shutil.rmtree(DATA)
        raise
    print(f"wrote {DATA}")


if __name__ == "__main__":
    main()
