"""Shared fixtures: small real image sets written with Pillow, a real S3 server, real users.

- ``images``, ``client_images``: small JPEG covers (:func:`write_images`).
- ``s3``: a real S3 API (moto) on 127.0.0.1, served by another process that
  counts every request it serves (:class:`benchmarks.s3server.S3Process`).
- ``base``, ``accounts``: a ``0o1777`` directory other users can reach, and
  users and groups made for one test (:mod:`tests._uids`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from benchmarks.s3server import S3Process

from . import _uids

#: Modules that tests import only in other processes (a model's module, one that imports
#: slowly): --doctest-modules must not import them into the test process.
collect_ignore = ["_batch_model.py", "_slow_start.py"]


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


def doctest_setting(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Where the package's docstring examples run: a fresh working directory ``root``.

    It holds ``images/``, eight small covers whose relative paths are the name
    ``paths``; ``TSC_CACHE_DIR`` is a fresh cache in it. Returns the names the
    examples use (``paths``, ``tsc``, ``np``).
    """
    import tensorstore_cache

    monkeypatch.chdir(root)
    monkeypatch.setenv("TSC_CACHE_DIR", str(root / "cache"))
    monkeypatch.delenv("TSC_CACHE_GROUP", raising=False)
    monkeypatch.delenv("TSC_CACHE_MAX_BYTES", raising=False)
    paths = [os.path.relpath(p, root) for p in write_images(root / "images", 8)]
    return {"paths": paths, "tsc": tensorstore_cache, "np": np}


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


@pytest.fixture(scope="module")
def s3(request: pytest.FixtureRequest) -> Iterator[S3Process]:
    """A real S3 API for the tests of one module, holding the bucket its ``BUCKET`` names.

    Skips the test without ``s3fs`` and ``moto[server]``.
    """
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    server = S3Process()
    try:
        bucket = getattr(request.module, "BUCKET", None)
        if bucket is not None:
            server.create_bucket(bucket)
        yield server
    finally:
        server.stop()


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh ``0o1777`` directory in ``/tmp`` (pytest's own are ``0o700`` under root's)."""
    with _uids.shared_base() as b:
        yield b


@pytest.fixture
def accounts() -> Iterator[_uids.Accounts]:
    """Users and groups made for one test with ``useradd``/``groupadd``, removed after it."""
    if not _uids.have_user_tools():
        pytest.skip("needs useradd and groupadd")
    _uids.remove_leftovers()
    acc = _uids.Accounts()
    try:
        yield acc
    finally:
        acc.close()
