"""Seed method 2: the finished float32 vectors cached in a ``Manager().dict()``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._base import Column, default_loader
from ._manager import ManagerColumn, ManagerMethod


class _ImageVector:
    """The seed's ``image_vector(path)`` with the finished array cached in the manager."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __call__(self, shared: Any, path: str) -> np.ndarray:
        vector = shared.get(path)
        if vector is None:
            vector = self.loader(path)
            shared[path] = vector
        return vector


class ManagerVectors(ManagerMethod):
    name = "manager_vectors"
    summary = "seed method 2: finished vectors in a Manager().dict()"

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        return ManagerColumn(paths, state["shared"], _ImageVector(loader or default_loader()))


METHOD = ManagerVectors()
