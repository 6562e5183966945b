"""Decode CPU time counted inside the loader, in whichever process runs it.

A method may decode in the trial process itself (no cache, a Manager dict, ``torch.save``),
in a pool it starts (``datasets.map(num_proc=...)``, a tensorstore_cache build), or not at
all (the cache exists). The parent's ``rusage`` cannot tell these apart and misses
processes it did not wait for, so the loader itself is wrapped: :class:`DecodeMeter` calls
the real loader and appends one fixed-size record per call, ``(pid, CPU nanoseconds of
the calling thread)``, to a log file with ``O_APPEND`` (one ``write`` of 12 bytes, atomic
for regular files). :func:`read_log` sums a log.

The wrapper is picklable and forwards ``loader_id``, ``params`` and ``item_shape`` of the
loader it wraps, so a cache keyed by them sees the same loader.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

_RECORD = struct.Struct("<iq")


class DecodeMeter:
    """A loader ``path -> array`` that logs the CPU time of every call of ``inner``."""

    def __init__(self, inner: Any, log: str | os.PathLike[str]) -> None:
        self.inner = inner
        self.log = os.fspath(log)
        self._fd: int | None = None
        self._pid = -1

    @property
    def loader_id(self) -> str:
        return str(self.inner.loader_id)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.inner.params)

    @property
    def item_shape(self) -> tuple[int, ...]:
        return tuple(self.inner.item_shape)

    def __call__(self, path: Any) -> Any:
        t0 = time.thread_time_ns()
        out = self.inner(path)
        spent = time.thread_time_ns() - t0
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            self._fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                               0o644)
            self._pid = pid
        os.write(self._fd, _RECORD.pack(pid, spent))
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner, "log": self.log}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["inner"], state["log"])  # type: ignore[misc]


def read_log(log: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"calls", "cpu_s", "pids"}`` of a :class:`DecodeMeter` log (zeros if absent)."""
    try:
        with open(log, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = b""
    usable = len(data) - len(data) % _RECORD.size  # a process killed mid-write
    pids: set[int] = set()
    total = 0
    for pid, ns in _RECORD.iter_unpack(data[:usable]):
        pids.add(pid)
        total += ns
    return {"calls": usable // _RECORD.size, "cpu_s": total / 1e9, "pids": sorted(pids)}
