"""Cheap module-level loaders for the cache tests (importable by spawned processes).

Each call is logged as one ``"<pid> <key>\\n"`` line appended with
``O_APPEND`` (one ``write`` per line, so lines of concurrent processes never
interleave), which lets a test count how often every item was computed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import xxhash

ITEM_SHAPE = (4,)


def vector_of(data: bytes) -> np.ndarray:
    """The vector a :class:`LogLoader` computes from a file's bytes."""
    h = xxhash.xxh3_64_intdigest(data)
    return np.array(
        [len(data), h % 9973, data[0] if data else -1, (h >> 20) % 7919], dtype=np.float32
    )


def log_lines(log: Path) -> list[tuple[int, str]]:
    """Return every ``(pid, key)`` logged so far."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        pid, key = line.split(" ", 1)
        out.append((int(pid), key))
    return out


class LogLoader:
    """Read a file and return :func:`vector_of` its bytes, logging the call.

    Parameters
    ----------
    log
        The call log (appended to).
    delay
        Seconds to sleep per call (a slow transform).
    """

    loader_id = "tests.log_loader/1"
    item_shape = ITEM_SHAPE

    def __init__(self, log: str | Path, delay: float = 0.0, scale: int = 1) -> None:
        self.log = str(log)
        self.delay = delay
        self.scale = scale

    @property
    def params(self) -> dict[str, int]:
        return {"scale": self.scale}

    def __call__(self, key: str) -> np.ndarray:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {key}\n".encode())
        finally:
            os.close(fd)
        if self.delay:
            time.sleep(self.delay)
        with open(key, "rb") as f:
            return vector_of(f.read()) * self.scale


class MeetingLoader(LogLoader):
    """A :class:`LogLoader` whose calls wait until ``parties`` processes have logged one.

    Racers building at the same time meet here, so a race that only duplicates work when
    builders overlap duplicates it every time. Where only one process can build (the build
    lock works), the wait ends at a hang guard and the build goes on alone.
    """

    GUARD_S = 30.0  # a guard against hangs, not a timing assertion

    def __init__(self, log: str | Path, parties: int) -> None:
        super().__init__(log)
        self.parties = parties

    def __call__(self, key: str) -> np.ndarray:
        out = super().__call__(key)
        deadline = time.monotonic() + self.GUARD_S
        while len({pid for pid, _key in log_lines(Path(self.log))}) < self.parties:
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return out


class GateLoader(LogLoader):
    """A :class:`LogLoader` whose calls wait until the file ``gate`` exists.

    A test holds a build at its first item (its lock taken, its log line written) for as
    long as it needs, then lets it go on by creating ``gate``.
    """

    GUARD_S = 120.0  # a guard against hangs, not a timing assertion

    def __init__(self, log: str | Path, gate: str | Path) -> None:
        super().__init__(log)
        self.gate = str(gate)

    def __call__(self, key: str) -> np.ndarray:
        out = super().__call__(key)
        deadline = time.monotonic() + self.GUARD_S
        while not os.path.exists(self.gate):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self.gate} was never opened")
            time.sleep(0.01)
        return out


def write_sources(root: Path, n: int, *, start: int = 0, seed: int = 0) -> list[str]:
    """Write ``n`` small files of random bytes; return their paths."""
    rng = np.random.default_rng(seed + start)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(start, start + n):
        p = root / f"src_{i:05d}.bin"
        p.write_bytes(rng.integers(0, 256, int(rng.integers(10, 200)), dtype=np.uint8).tobytes())
        paths.append(str(p))
    return paths


def expected(paths: list[str], scale: int = 1) -> np.ndarray:
    """The vectors of ``paths``, computed directly."""
    return np.stack([vector_of(Path(p).read_bytes()) * scale for p in paths])
