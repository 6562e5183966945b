"""Shared fixtures: small real image sets written with Pillow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def write_images(root: Path, n: int, *, seed: int = 0, gray_every: int = 0) -> list[str]:
    """Write ``n`` small JPEG covers of varied sizes under ``root``; return their paths."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        h, w = int(rng.integers(20, 60)), int(rng.integers(15, 50))
        sub = root / f"d{i % 7}"
        sub.mkdir(parents=True, exist_ok=True)
        p = sub / f"img_{i:05d}.jpg"
        if gray_every and i % gray_every == 0:
            Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L").save(p, quality=85)
        else:
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p, quality=85)
        paths.append(str(p))
    return paths


@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    """Sixty small JPEGs, every tenth grayscale."""
    return write_images(tmp_path / "images", 60, gray_every=10)


@pytest.fixture(scope="session")
def client_images(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """150 small covers shared by the tests that use the library as its users do.

    With ``workers=2`` a build of them has three shards of 64 rows: the pool's
    worker always builds some, the building process the others.
    """
    return write_images(tmp_path_factory.mktemp("client-images"), 150, seed=9)
