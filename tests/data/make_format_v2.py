"""Write ``tests/data/format_v2/``: a store and a cache namespace of on-disk format 2 (records).

Run once, from the checkout's root, with the code that writes format 2::

    .venv/bin/python -m tests.data.make_format_v2

It writes the sources (``format_v2/sources/``, small JSON files), then, with
the working directory at ``format_v2/`` (keys are relative paths), only
through the public API, the way ``make_format_v1`` does:

- ``records.store/``: :func:`~tensorstore_cache.build_store` of the six
  ``sources/rows/*.json`` with :class:`JsonRecords` and the fields
  :data:`FIELDS`: a fixed ``vec`` ``(3,)`` float32, a ragged 1-D ``ids``
  (int32), a ragged ``pic`` of two varying dimensions (uint8) and a text
  ``name``; ``on_error="skip"`` (``bad.json`` is no record: one skipped
  row), two rows per shard of ``vec``;
- ``cache/<namespace>/``: two :func:`~tensorstore_cache.cached` calls with
  the same loader and fields. The first computes ``a``, ``b`` and ``c``
  (``c.json`` holding ``c.first``); then ``c.json`` gets the bytes of
  ``c.second`` and a later mtime, and the second call
  (``identity="content"``) computes ``c`` again and ``d`` into a second part
  that overrides the first for ``c`` and has a ``.source_xxh3`` side file.

Every source's ``mtime_ns`` is fixed before each build (:data:`FIRST_NS`,
:data:`SECOND_NS`), so nothing is racily clean and every recorded identity
is the same on every run. ``tests/test_guarantees/test_format_v2.py`` reads
these files with the current reader and rebuilds them with :func:`build_all`
to check that the writer still writes them byte for byte (but for build
times, part ids and the manifests' writer).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import tensorstore_cache as tsc

from .make_format_v1 import FIRST_NS, SECOND_NS, _cwd, _set_mtimes

__all__ = [
    "DATA",
    "FIELDS",
    "FIRST_NS",
    "LOADER",
    "ROW_KEYS",
    "SECOND_NS",
    "SKIPPED",
    "JsonRecords",
    "build_all",
    "write_sources",
]

#: The committed data.
DATA = Path(__file__).resolve().parent / "format_v2"

#: The paths of the store, in row order; ``bad.json`` fails and is skipped.
ROW_KEYS = (
    "sources/rows/r0.json",
    "sources/rows/r1.json",
    "sources/rows/bad.json",
    "sources/rows/r2.json",
    "sources/rows/r3.json",
    "sources/rows/r4.json",
)
#: The path that fails to load.
SKIPPED = "sources/rows/bad.json"
#: The keys of the two calls of ``cached()``.
FIRST_CALL = ("sources/ns/a.json", "sources/ns/b.json", "sources/ns/c.json")
SECOND_CALL = ("sources/ns/b.json", "sources/ns/c.json", "sources/ns/d.json")

#: The declared fields: fixed, ragged 1-D, ragged of two varying dimensions, text.
FIELDS: dict[str, tsc.Fixed | tsc.Ragged | tsc.Text] = {
    "vec": tsc.Fixed((3,), "float32"),
    "ids": tsc.Ragged("int32"),
    "pic": tsc.Ragged("uint8", (None, None)),
    "name": tsc.Text(),
}


@dataclass(frozen=True, slots=True)
class JsonRecords:
    """Read a source's JSON object as a record of :data:`FIELDS`.

    A source that is not such an object fails with a :class:`ValueError` naming it.
    """

    loader_id: ClassVar[str] = "tests.format_v2.json/1"

    def __call__(self, path: str) -> dict[str, Any]:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
            return {
                "vec": np.array(raw["vec"], np.float32),
                "ids": np.array(raw["ids"], np.int32),
                "pic": np.array(raw["pic"], np.uint8).reshape(raw["pic_shape"]),
                "name": str(raw["name"]),
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a record: {type(exc).__name__}") from None


LOADER = JsonRecords()


def _record(i: int, name: str) -> str:
    """A record's JSON: ``i`` sets its values and sizes (``ids`` of 0 to 4 values, ``pic`` of
    ``1 + i % 2`` by ``1 + i % 3``)."""
    h, w = 1 + i % 2, 1 + i % 3
    return json.dumps({
        "vec": [i + 0.5, -i - 0.25, float(i) * 1e30],
        "ids": [i * 7 + j - 3 for j in range(i % 5)],
        "pic": [(i * 37 + j * 11) % 256 for j in range(h * w)],
        "pic_shape": [h, w],
        "name": name,
    }, sort_keys=True)


def write_sources(root: Path) -> None:
    """Write the source files under ``root/sources``."""
    rows = root / "sources" / "rows"
    ns = root / "sources" / "ns"
    rows.mkdir(parents=True)
    ns.mkdir(parents=True)
    names = ["Dune", "", "Über — ünïcode ✓", "a\nnew line", "x" * 40]
    for i, name in enumerate(names):
        (rows / f"r{i}.json").write_text(_record(i, name), encoding="utf-8")
    (rows / "bad.json").write_text("[1, 2]", encoding="utf-8")
    for i, key in enumerate(("a", "b", "c.first", "c.second", "d")):
        (ns / f"{key}.json").write_text(_record(10 + i, key), encoding="utf-8")
    shutil.copyfile(ns / "c.second.json", ns / "c.json")


def build_all(root: Path) -> None:
    """Build ``records.store`` and ``cache/`` in ``root`` from ``root/sources``.

    ``root/sources/ns/c.json`` ends holding the bytes of ``c.second.json``.
    """
    ns = root / "sources" / "ns"
    _set_mtimes(root, FIRST_NS)
    with _cwd(root):
        tsc.build_store(list(ROW_KEYS), "records.store", loader=LOADER, fields=FIELDS,
                        on_error="skip", workers=1, progress=False, shard_bytes=2 * 12).close()
        shutil.copyfile(ns / "c.first.json", ns / "c.json")
        _set_mtimes(root, FIRST_NS)
        tsc.cached(list(FIRST_CALL), cache_dir=root / "cache", loader=LOADER, fields=FIELDS,
                   workers=1, progress=False).close()
        shutil.copyfile(ns / "c.second.json", ns / "c.json")
        os.utime(ns / "c.json", ns=(SECOND_NS, SECOND_NS))
        tsc.cached(list(SECOND_CALL), cache_dir=root / "cache", loader=LOADER, fields=FIELDS,
                   workers=1, progress=False, identity="content").close()


def main() -> None:
    """Write the committed data once; refuse to overwrite it."""
    if DATA.exists():
        sys.exit(f"{DATA} exists: format 2 is written once; delete it only to start over")
    DATA.mkdir(parents=True)
    write_sources(DATA)
    build_all(DATA)
    print(f"wrote {DATA}")


if __name__ == "__main__":
    main()
