"""Stamped timelines: events of several processes written to one file, in seconds."""

from __future__ import annotations

import os
import time


class Stamps:
    """Appends ``seconds-since-start pid event`` lines to a file (any process may write).

    Picklable: a worker process that receives it stamps into the same file.
    """

    def __init__(self, path: str, start: float) -> None:
        self.path, self.start = path, start

    def __call__(self, event: str, at: float | None = None) -> None:
        """Stamp ``event`` now, or at ``at`` (seconds since the epoch)."""
        when = time.time() if at is None else at
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{when - self.start:.3f} {os.getpid()} {event}\n")
