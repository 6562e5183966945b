"""Sources and loaders of records for the tests (importable by spawned processes).

A source ``<i>.bin`` holds ``i`` as text. Its record: an ``image`` (3x4x4
uint8, all ``i % 251``), ``title_ids`` (int32, ``i % 9 + 1`` ids from ``i``),
``rating`` (float32 scalar, ``i / 4``), ``title`` (text, ``"book <i>"``), and,
for :class:`BoxLoader`, ``boxes`` (float32 ``(i % 5, 4)``) and ``pic`` (uint8
``(3, h, w)`` with ``h``, ``w`` varying).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

import tensorstore_cache as tsc

FIELDS: dict[str, tsc.Fixed | tsc.Ragged | tsc.Text] = {
    "image": tsc.Fixed((3, 4, 4), "uint8"),
    "title_ids": tsc.Ragged("int32"),
    "rating": tsc.Fixed((), "float32"),
    "title": tsc.Text(),
}

BOX_FIELDS: dict[str, tsc.Fixed | tsc.Ragged | tsc.Text] = {
    **FIELDS,
    "boxes": tsc.Ragged("float32", shape=(None, 4)),
    "pic": tsc.Ragged("uint8", shape=(3, None, None)),
}


def write_sources(root: Path, n: int, start: int = 0) -> list[str]:
    """Write ``n`` sources; return their paths."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(start, start + n):
        p = root / f"{i}.bin"
        p.write_text(str(i))
        paths.append(str(p))
    return paths


def number(path: str) -> int:
    """The number a source holds."""
    return int(Path(path).read_text())


def number_vector(path: str) -> Any:
    """A tensor of the source (a store of one tensor per key): four float32 copies of ``i``."""
    return np.full(4, number(path), np.float32)


def expected(path: str, boxes: bool = False) -> dict[str, Any]:
    """The record of ``path``, computed directly."""
    i = number(path)
    out: dict[str, Any] = {
        "image": np.full((3, 4, 4), i % 251, np.uint8),
        "title_ids": np.arange(i, i + i % 9 + 1, dtype=np.int32),
        "rating": np.float32(i / 4),
        "title": f"book {i}",
    }
    if boxes:
        out["boxes"] = np.full((i % 5, 4), i, np.float32)
        out["pic"] = np.full((3, i % 3 + 1, i % 4 + 2), i % 251, np.uint8)
    return out


class RecordLoader:
    """The records of :func:`expected`, each call logged as ``<pid> <key>`` (``O_APPEND``).

    Fails on the sources numbered in ``fail``; a process other than ``builder``
    that meets source ``kill`` SIGKILLs itself. With ``started`` (a source number
    and a file), a process other than ``builder`` that meets that source creates
    the file, and ``builder`` waits for it (at most a minute) at its first source
    numbered above ``kill``: the worker has then started the task holding ``kill``,
    which the builder can no longer take back.
    """

    def __init__(self, log: str | Path | None = None, boxes: bool = False,
                 fail: tuple[int, ...] = (), kill: int = -1, builder: int = 0,
                 started: tuple[int, str] | None = None) -> None:
        self.log = None if log is None else str(log)
        self.boxes = boxes
        self.fail = fail
        self.kill = kill
        self.builder = builder
        self.started = started

    def __call__(self, path: str) -> dict[str, Any]:
        if self.log is not None:
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{os.getpid()} {path}\n".encode())
            finally:
                os.close(fd)
        if number(path) in self.fail:
            raise ValueError(f"source {number(path)} is unreadable")
        if self.started is not None:
            self._sync(number(path), *self.started)
        if number(path) == self.kill and os.getpid() != self.builder:
            os.kill(os.getpid(), signal.SIGKILL)
        return expected(path, self.boxes)

    def _sync(self, i: int, source: int, flag: str) -> None:
        if os.getpid() != self.builder:
            if i == source:
                Path(flag).touch()
            return
        deadline = time.monotonic() + 60
        while i > self.kill and not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.01)


def same(record: Any, want: dict[str, Any]) -> bool:
    """Whether a stored record equals ``want`` field by field (values and dtypes)."""
    if list(record) != list(want):
        return False
    for name, value in want.items():
        got = record[name]
        if isinstance(value, str):
            if got != value:
                return False
        elif got.dtype != value.dtype or not np.array_equal(got, value):
            return False
    return True


#: the data files of :func:`build_box_store`'s stores: about 4 KiB, several a field
SHARD_BYTES = 4096


def build_box_store(base: Path, n: int) -> tuple[list[str], Path]:
    """Write ``n`` sources under ``base / "src"`` and build the store of their records with
    boxes at ``base / "r.tsc"`` (every kind of field, in data files of about 4 KiB: a shard
    of a fixed field, a chunk of a ragged field's values); return the sources and the store."""
    paths = write_sources(base / "src", n)
    root = base / "r.tsc"
    tsc.build_store(paths, root, loader=RecordLoader(boxes=True), loader_id="rec/1",
                    fields=BOX_FIELDS, workers=1, progress=False, shard_bytes=SHARD_BYTES).close()
    return paths, root
