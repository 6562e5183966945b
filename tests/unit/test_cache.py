"""Layer 6, cache: namespace names stay what earlier releases wrote; options by keyword."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorstore_cache.cache.cached import CacheOptions, cached_store
from tensorstore_cache.cache.compact import MAX_PARTS, merge_start
from tensorstore_cache.cache.fingerprint import canonical_json, fingerprint, namespace_name
from tensorstore_cache.loaders import ImageLoader, resolve_loader
from tensorstore_cache.writer.options import BuildOptions


def test_namespace_names_are_those_earlier_releases_wrote() -> None:
    # a cache filled by an earlier release must be found again: the names are part of the layout
    image = ImageLoader()
    fp = fingerprint(image.loader_id, image.params, "float32")
    assert namespace_name(fp) == "tensorstore_cache.image_1-float32-5707ec49a22152cb3cfe"
    fp = fingerprint("myproject.thumbnails/2", {"size": [64, 64], "x": "é"}, "uint8")
    assert namespace_name(fp) == "myproject.thumbnails_2-uint8-6ccdffa1b6c87ac67564"


def test_fingerprints_are_canonical_and_refuse_non_json_params() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'
    with pytest.raises(TypeError, match="must be JSON values"):
        fingerprint("x/1", {"f": object()}, "float32")


def test_merge_start() -> None:
    assert merge_start([100], 0) is None
    assert merge_start([100, 100], 60) == 0  # too many dead rows: merge everything
    assert merge_start([1000] + [1] * MAX_PARTS, 0) == 1  # the increments after the big part


def test_cache_options_by_keyword_and_a_store_from_them(tmp_path: Path) -> None:
    loader = resolve_loader(None, size=(4, 4), strict=True)
    build = BuildOptions(loader=loader, workers=1, progress=False)
    with pytest.raises(TypeError):
        CacheOptions(build)  # type: ignore[call-arg]
    src = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8), (255, 0, 0)).save(src)
    with cached_store(tmp_path / "cache", [str(src)], CacheOptions(build=build)) as store:
        assert store.shape == (1, 3, 4, 4) and float(store[str(src)][0].min()) == 1.0
        assert Path(store.location).name == namespace_name(
            fingerprint(loader.loader_id, loader.params, "float32")
        )
