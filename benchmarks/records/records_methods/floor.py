"""The decode-only floor of a build: the same records computed by 2 processes, nothing written.

Not a way of storing records: what any build of these records costs at least, on the same
machine, from the same loader. Two ``fork``-ed processes (the parent only hands out keys)
compute the record of every key, 64 keys at a time, and throw it away (each sends back a
count); nothing is written, nothing is read back. A build's time over this one's is what its
writing, its worker processes' start and its publishing cost.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._base import Reader, RecordMethod

_LOADER: list[Callable[[str], dict[str, Any]]] = []


def _set_loader(loader: Callable[[str], dict[str, Any]]) -> None:
    _LOADER[:] = [loader]


def _compute(key: str) -> int:
    record = _LOADER[0](key)
    return len(record)


class DecodeFloor(RecordMethod):
    name = "decode_floor"
    summary = "the floor: every record computed by 2 processes, nothing written"

    def build(self, keys: list[str], out: Path, loader: Callable[[str], dict[str, Any]],
              workers: int, *, synthetic: bool = False) -> dict[str, Any]:
        with multiprocessing.get_context("fork").Pool(
                workers, initializer=_set_loader, initargs=(loader,)) as pool:
            fields = sum(pool.imap_unordered(_compute, keys, chunksize=64))
        if fields != 3 * len(keys):
            raise RuntimeError(f"{fields} fields computed for {len(keys)} records")
        return {}

    def open(self, out: Path, built: dict[str, Any]) -> Reader:
        raise NotImplementedError("the decode-only floor writes nothing to open")


METHOD = DecodeFloor()
