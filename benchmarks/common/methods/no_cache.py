"""No cache: every agent decodes every image (the seed's "before")."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ._base import PASS_BATCH, Column, Method, default_loader


class NoCacheColumn(Column):
    """The vectors this agent decoded, held as the seed held them (a list of arrays)."""

    def __init__(self, paths: list[str], loader: Any) -> None:
        super().__init__(paths)
        self.loader = loader
        self.vectors = [loader(p) for p in paths]

    def lookup(self, path: str) -> Any:
        # Nothing is cached anywhere: another process (or the DataLoader worker)
        # that needs the vector of a path decodes the image again.
        return self.loader(path)

    def batch(self, rows: np.ndarray) -> np.ndarray:
        return np.stack([self.loader(self.paths[r]) for r in rows.tolist()])

    def full_pass(self, batch_size: int = PASS_BATCH) -> float:
        return float(sum(float(v.sum(dtype=np.float64)) for v in self.vectors))


class NoCache(Method):
    name = "no_cache"
    summary = "every agent decodes every image (PIL open + resize + to float)"
    synthetic = False

    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        shutil.rmtree(workdir, ignore_errors=True)
        return {}

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        return NoCacheColumn(paths, loader or default_loader())

    def disk_bytes(self, state: dict[str, Any]) -> int | None:
        return None


METHOD = NoCache()
