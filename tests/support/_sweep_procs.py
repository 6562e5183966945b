"""Targets of the processes ``test_sweep`` starts (a light module: spawned children import it)."""

from __future__ import annotations

from typing import Any

import numpy as np


def map_and_hold(path: str, ready: Any, stop: Any) -> None:
    """Map ``path``, touch every page, say so, and hold the mapping until told to stop."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    int(data[::4096].sum())
    ready.set()
    stop.wait(60)
