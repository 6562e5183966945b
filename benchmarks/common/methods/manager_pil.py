"""Seed method 1: the resized PIL image cached in a ``Manager().dict()``.

Each agent's ``image_vector(path)`` gets the resized image from the shared dict (or
decodes and resizes it and stores it there), then applies ``ToTensor`` to it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._base import SIZE, Column
from ._manager import ManagerColumn, ManagerMethod


class _ImageVector:
    """The seed's ``image_vector(path)`` with the PIL image cached in the manager."""

    def __init__(self) -> None:
        from tensorstore_cache.loaders import ImageLoader, to_float32

        # decode + convert + Resize((32, 32)), kept as pixels: the seed's ``scale(img)``
        self.resize = ImageLoader(SIZE, dtype="uint8")
        self.to_tensor = to_float32  # bit-identical to torchvision's ToTensor()

    def __call__(self, shared: Any, path: str) -> np.ndarray:
        from PIL import Image

        img = shared.get(path)
        if img is None:
            pixels = self.resize(path)
            img = Image.fromarray(np.ascontiguousarray(pixels.transpose(1, 2, 0)), "RGB")
            shared[path] = img
        return self.to_tensor(np.asarray(img).transpose(2, 0, 1))


class ManagerPil(ManagerMethod):
    name = "manager_pil"
    summary = "seed method 1: resized PIL images in a Manager().dict(), ToTensor per item"

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        return ManagerColumn(paths, state["shared"], _ImageVector())


METHOD = ManagerPil()
