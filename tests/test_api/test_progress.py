"""A build's progress bar says what it builds: the loader, the item and the work, never a part id."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import tensorstore_cache as tsc

from ..conftest import write_images
from ..support._cache_loaders import LogLoader, write_sources
from ..support._loaders import Filled

#: A part id (what the bar of a cache's build said before).
PART_ID = re.compile(r"[0-9a-f]{8,16}-[0-9a-f]{8}")


def test_cached_names_the_loader_the_item_and_the_work(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    keys = write_sources(tmp_path / "src", 5)
    cache, loader = tmp_path / "cache", LogLoader(tmp_path / "log")
    tsc.cached(keys[:3], cache_dir=cache, loader=loader, workers=1).close()
    first = capfd.readouterr().err
    assert "building tests.log_loader/1 4 float32, 3 new of 3: 100%" in first
    tsc.cached(keys, cache_dir=cache, loader=loader, workers=1).close()
    assert "building tests.log_loader/1 4 float32, 2 new of 5: 100%" in capfd.readouterr().err
    # a source rewritten: its entry is computed again, with a new one
    Path(keys[0]).write_bytes(b"rewritten")
    os.utime(keys[0], ns=(1_000_000_000, 1_000_000_000))
    extra = write_sources(tmp_path / "more", 1, start=5)
    tsc.cached([*keys, *extra], cache_dir=cache, loader=loader, workers=1).close()
    third = capfd.readouterr().err
    assert "building tests.log_loader/1 4 float32, 1 new, 1 changed of 6: 100%" in third
    tsc.cached(keys[1:], cache_dir=cache, loader=loader, workers=1).close()  # all cached
    assert "building" not in capfd.readouterr().err
    # only stale entries
    Path(keys[1]).write_bytes(b"rewritten too")
    os.utime(keys[1], ns=(1_000_000_000, 1_000_000_000))
    tsc.cached(keys, cache_dir=cache, loader=loader, workers=1).close()
    fourth = capfd.readouterr().err
    assert "building tests.log_loader/1 4 float32, 1 changed of 5: 100%" in fourth
    for err in (first, third, fourth):
        assert not PART_ID.search(err), err


def test_cached_counts_with_separators_and_a_loader_without_a_shape(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    keys = [f"k{i}" for i in range(1200)]
    store = tsc.cached(keys, cache_dir=tmp_path / "cache", loader=Filled((2, 3), dtype="float64"),
                       loader_id="tests.filled/1", dtype="float64", workers=1, identity="none")
    assert store[keys[1107]].tolist() == [[1107.0] * 3] * 2
    store.close()
    # the loader declares no item shape and the cache is new: the shape is not known yet
    assert "building tests.filled/1 float64, 1,200 new of 1,200: 100%" in capfd.readouterr().err


def test_the_image_loader_is_named_short(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    images = write_images(tmp_path / "images", 4)
    tsc.cached(images, cache_dir=tmp_path / "cache", size=(16, 24), dtype="uint8",
               workers=1).close()
    assert "building image/1 3x16x24 uint8, 4 new of 4: 100%" in capfd.readouterr().err


def test_build_store_names_its_target(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    tsc.build_store([f"k{i}" for i in range(5)], tmp_path / "covers.tsc", loader=Filled(),
                    workers=1, identity="none").close()
    assert "building covers.tsc: 100%" in capfd.readouterr().err
