"""Shared plumbing of the two ``multiprocessing.Manager().dict()`` methods (seed 1, 2)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np

from ._base import PASS_BATCH, Column, Method


class ManagerColumn(Column):
    """What a seed agent holds: every vector in a list, plus the shared dict proxy.

    ``fetch(shared, path)`` is the seed's ``image_vector(path)``: a cache hit is one
    round trip to the manager process (the value is pickled through its socket), a
    miss computes the value and stores it in the manager.
    """

    def __init__(self, paths: list[str], shared: Any, fetch: Any) -> None:
        super().__init__(paths)
        self.shared = shared
        self.fetch = fetch
        self.hit = len(shared) > 0
        # the seed's loop: data_box.append(np.array(image_vector(path)))
        self.vectors = [fetch(shared, p) for p in paths]

    def lookup(self, path: str) -> Any:
        return self.fetch(self.shared, path)

    def batch(self, rows: np.ndarray) -> np.ndarray:
        return np.stack([self.fetch(self.shared, self.paths[r]) for r in rows.tolist()])

    def full_pass(self, batch_size: int = PASS_BATCH) -> float:
        return float(sum(float(v.sum(dtype=np.float64)) for v in self.vectors))


class ManagerMethod(Method):
    """A ``Manager().dict()`` created once by the driver and passed to every agent."""

    synthetic = False

    def __init__(self) -> None:
        self._manager: Any = None

    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        self.teardown()
        # the seed: manager = multiprocessing.Manager(); shared = manager.dict()
        self._manager = multiprocessing.get_context("spawn").Manager()
        return {"shared": self._manager.dict(), "manager_pid": self._manager._process.pid}

    def teardown(self) -> None:
        if self._manager is not None:
            self._manager.shutdown()
            self._manager = None

    def disk_bytes(self, state: dict[str, Any]) -> int | None:
        return None

    def server_pids(self, state: dict[str, Any]) -> list[int]:
        return [state["manager_pid"]]
