"""Stamped timelines: events of several processes written to one file, in seconds."""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_started_at() -> float:
    """When this process started, in seconds since the epoch (to the kernel's clock tick:
    its start in ticks since boot against the uptime now, not the boot time in whole
    seconds that ``psutil`` adds)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class Stamps:
    """Appends ``seconds-since-start pid event`` lines to a file (any process may write).

    Picklable: a worker process that receives it stamps into the same file.
    """

    def __init__(self, path: str, start: float) -> None:
        self.path, self.start = path, start

    def __call__(self, event: str, at: float | None = None, cpu: bool = False) -> None:
        """Stamp ``event`` now, or at ``at`` (seconds since the epoch); with ``cpu``, as
        ``[C] event``, C the CPU seconds (user and system) this process has used so far."""
        when = time.time() if at is None else at
        if cpu:
            event = f"[{time.process_time():.3f}] {event}"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{when - self.start:.3f} {os.getpid()} {event}\n")
