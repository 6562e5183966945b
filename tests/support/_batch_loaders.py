"""Batch loaders for the batched-build tests (importable by the device worker processes).

Every call is logged, one ``O_APPEND`` line per event, in a directory given to
the loader: ``setup <pid> <device>``, ``batch <pid> <n> <first item>``,
``prepare <pid> <key>``; :mod:`tests.support._batch_model`, which the loaders import
in ``setup`` only, logs ``import <pid>`` when it is imported.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

import tensorstore_cache as tsc
from benchmarks.embed.embed_model import CoverEmbed


def log(where: str | os.PathLike[str], line: str) -> None:
    """Append one line to ``<where>/log``."""
    fd = os.open(Path(where) / "log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def events(where: str | os.PathLike[str], kind: str) -> list[list[str]]:
    """The logged events of ``kind``, each as its words after the kind."""
    path = Path(where) / "log"
    if not path.exists():
        return []
    return [line.split(" ")[1:] for line in path.read_text().splitlines()
            if line.split(" ")[0] == kind]


def value_of(item: str) -> np.ndarray:
    """What :class:`Embed` computes for one item (a key, or a prepared key)."""
    h = sum(ord(c) * (i + 1) for i, c in enumerate(item))
    return np.array([len(item), h % 997, h % 13, 1.0], np.float32)


class Embed(tsc.BatchLoader):
    """One vector per item (:func:`value_of`); raises on a batch holding an item with ``bad``."""

    def __init__(self, where: str, **batching: Any) -> None:
        super().__init__(**batching)
        self.where = where
        self.model: Any = None

    def setup(self, device: str) -> None:
        from . import _batch_model

        self.model = _batch_model.MODEL
        log(self.where, f"setup {os.getpid()} {device} {self.device}")

    def __call__(self, items: list[Any]) -> Any:
        log(self.where, f"batch {os.getpid()} {len(items)} {items[0]}")
        if any("bad" in str(item) for item in items):
            raise ValueError(f"a bad item among {len(items)}")
        return np.stack([value_of(str(item)) for item in items])


class Prepare:
    """A ``prepare`` that logs where it runs and appends ``!`` to the key; in the process
    ``slow_in`` it takes ``delay_s`` per key (so that the pool's workers surely get some)."""

    def __init__(self, where: str, slow_in: int = 0, delay_s: float = 0.02) -> None:
        self.where = where
        self.slow_in = slow_in
        self.delay_s = delay_s

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # unpickled in a CPU worker when it starts
        log(self.where, f"started {os.getpid()}")

    def __call__(self, key: str) -> str:
        log(self.where, f"prepare {os.getpid()} {key}")
        if os.getpid() == self.slow_in:
            time.sleep(self.delay_s)
        if "unprepared" in key:
            raise OSError(f"cannot prepare {key}")
        return key + "!"


#: how long a device worker waits for a CPU worker to start before it gives up (logging
#: ``gave-up``; well within the test's own timeout): a guard against hangs on a loaded
#: machine, not a timing assertion
HANG_GUARD_S = 120.0


class AfterCpuWorker(Embed):
    """Sets up only once a CPU worker has started (a ``started`` line beyond the ``seen``
    ones of earlier builds): so a batch before that is impossible if the CPU workers start
    beside the device worker. If they started only after the first batch, the wait would
    never end: after :data:`HANG_GUARD_S` it logs ``gave-up <pid>`` and sets up anyway, and
    the batch comes first."""

    def __init__(self, where: str, seen: int, **batching: Any) -> None:
        super().__init__(where, **batching)
        self.seen = seen

    def setup(self, device: str) -> None:
        deadline = time.monotonic() + HANG_GUARD_S
        while len(events(self.where, "started")) <= self.seen:
            if time.monotonic() > deadline:
                log(self.where, f"gave-up {os.getpid()}")
                break
            time.sleep(0.05)
        super().setup(device)


class ShortBatches(Embed):
    """Returns one row too few for a batch holding ``k5``."""

    def __call__(self, items: list[Any]) -> Any:
        rows = super().__call__(items)
        return rows[:-1] if "k5" in items else rows


class Records(Embed):
    """A record per item: a fixed ``vec`` and a ragged ``ids`` (as a list, or a
    :class:`tsc.Ragged` batch with ``as_ragged``)."""

    def __init__(self, where: str, as_ragged: bool = False, **batching: Any) -> None:
        super().__init__(where, **batching)
        self.as_ragged = as_ragged

    def __call__(self, items: list[Any]) -> Any:
        vec = super().__call__(items)
        ids = [np.arange(len(str(item)) % 5 + 1, dtype=np.int32) for item in items]
        return {"vec": vec, "ids": tsc.Ragged.from_rows(ids, "int32") if self.as_ragged else ids}


class FailingSetup(tsc.BatchLoader):
    """Its setup raises."""

    def setup(self, device: str) -> None:
        raise RuntimeError(f"no such device {device}")

    def __call__(self, items: list[Any]) -> Any:
        return np.zeros((len(items), 2), np.float32)


class LoggedCoverEmbed(CoverEmbed):
    """The benchmark's CNN, logging every batch."""

    def __init__(self, where: str, **batching: Any) -> None:
        super().__init__(threads=1, **batching)
        self.where = where

    def setup(self, device: str) -> None:
        log(self.where, f"setup {os.getpid()} {device} {self.device}")
        super().setup(device)

    def __call__(self, items: list[Any]) -> Any:
        log(self.where, f"batch {os.getpid()} {len(items)} -")
        return super().__call__(items)


class _LogsWhenCollected:
    """Logs ``collected <pid>`` when it is collected: at the interpreter's teardown at last."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __del__(self) -> None:
        log(self.where, f"collected {os.getpid()}")


#: Bytes of the block :func:`faults_of_large_blocks` allocates: above the 32 MiB up to which
#: glibc's default threshold adapts, so that its defaults map it and unmap it every time.
LARGE_BLOCK = 64 << 20


def faults_of_large_blocks(times: int = 8) -> int:
    """The page faults of allocating, filling and freeing a :data:`LARGE_BLOCK` ``times``,
    after doing it once: at least one a time if the block is unmapped when freed (whatever
    the page size), about none if it is kept for reuse."""
    import resource

    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)  # this thread's alone
    np.ones(LARGE_BLOCK // 8)
    before = resource.getrusage(who).ru_minflt
    for _ in range(times):
        block = np.ones(LARGE_BLOCK // 8)
        del block
    return resource.getrusage(who).ru_minflt - before


class Leaves(Embed):
    """Writes to a text file and to a gzip file over an open file, opened in ``setup`` and
    never flushed nor closed, registers an ``atexit`` handler there, keeps an object that logs
    when it is collected, and logs the ``OMP_WAIT_POLICY`` it was started with and the page
    faults of allocating a large block again and again."""

    def setup(self, device: str) -> None:
        import atexit
        import gzip

        super().setup(device)
        log(self.where, f"omp {os.environ.get('OMP_WAIT_POLICY', '-')}")
        log(self.where, f"faults {faults_of_large_blocks()}")
        self.kept = open(Path(self.where) / "kept.txt", "w", encoding="utf-8")  # noqa: SIM115
        self.kept.write(f"setup {os.getpid()}\n")
        raw = open(Path(self.where) / "kept.gz", "wb")  # noqa: SIM115
        self.zipped = gzip.GzipFile(fileobj=raw, mode="wb")  # closing it leaves raw open
        self.raw = raw
        self.collected = _LogsWhenCollected(self.where)
        atexit.register(log, self.where, f"atexit {os.getpid()}")

    def __call__(self, items: list[Any]) -> Any:
        self.kept.write(f"batch {len(items)}\n")
        self.zipped.write(f"batch {len(items)}\n".encode())
        return super().__call__(items)
