"""Locations: every input resolved once, options that do not apply refused, one open per thing."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.format.metadata import GroupMetadata

from ..support._cache_loaders import LogLoader, expected, write_sources


@pytest.fixture
def keys(tmp_path: Path) -> list[str]:
    return write_sources(tmp_path / "src", 40)


@pytest.fixture
def store_dir(keys: list[str], tmp_path: Path) -> Path:
    tsc.build_store(keys, tmp_path / "s.tsc", loader=LogLoader(tmp_path / "log"), workers=1,
                    progress=False).close()
    return tmp_path / "s.tsc"


@pytest.fixture
def namespace(keys: list[str], tmp_path: Path) -> Path:
    store = tsc.cached(keys, loader=LogLoader(tmp_path / "log"), cache_dir=tmp_path / "cache",
                       workers=1, progress=False)
    store.close()
    return Path(store.location)


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("option", [{"storage_options": {"anon": True}}])
def test_storage_options_on_a_local_path_are_refused(
    store_dir: Path, namespace: Path, option: dict[str, Any]
) -> None:
    for target in (store_dir, namespace, f"file://{store_dir}"):
        with pytest.raises(TypeError, match="'storage_options' was provided but unused"):
            tsc.open_store(target, **option)


@pytest.mark.parametrize(
    "option",
    [
        {"cache_dir": "/tmp/elsewhere"},
        {"share_with": 0},
        {"max_bytes": 1 << 30},
        {"local_copy": "always"},
        {"local_copy": "never"},
    ],
)
def test_node_cache_options_on_a_namespace_are_refused(
    namespace: Path, option: dict[str, Any]
) -> None:
    name = next(iter(option))
    with pytest.raises(TypeError, match=f"'{name}' was provided but unused: .* cache namespace"):
        tsc.open_store(namespace, **option)


@pytest.mark.parametrize("option", [{"cache_dir": "/tmp/x"}, {"share_with": 0}, {"max_bytes": 1}])
def test_node_cache_options_with_local_copy_never_are_refused(
    store_dir: Path, option: dict[str, Any]
) -> None:
    name = next(iter(option))
    with pytest.raises(TypeError, match=f"'{name}' was provided but unused: local_copy='never'"):
        tsc.open_store(store_dir, local_copy="never", **option)


@pytest.mark.parametrize(
    "option", [{"storage_options": {}}, {"share_with": 0}, {"cache_dir": "/tmp/x"}]
)
def test_build_store_to_a_local_path_refuses_url_options(
    keys: list[str], tmp_path: Path, option: dict[str, Any]
) -> None:
    name = next(iter(option))
    with pytest.raises(TypeError, match=f"'{name}' was provided but unused"):
        tsc.build_store(keys, tmp_path / "new.tsc", loader=LogLoader(tmp_path / "log"),
                        progress=False, **option)
    assert not (tmp_path / "new.tsc").exists()


def test_what_applies_is_accepted_and_environment_variables_never_refuse(
    store_dir: Path, namespace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TSC_CACHE_MAX_BYTES", str(1 << 30))
    monkeypatch.setenv("TSC_CACHE_DIR", str(tmp_path / "env-cache"))
    with tsc.open_store(namespace, local_copy="auto") as s:
        assert len(s) == 40
    with tsc.open_store(store_dir, cache_dir=tmp_path / "node") as s:  # may apply (network path)
        assert s.location == str(store_dir)
    with tsc.open_store(store_dir, local_copy="never") as s:
        assert s.location == str(store_dir)
    with tsc.open_store(store_dir, local_copy="always", cache_dir=tmp_path / "node",
                        max_bytes=1 << 30) as s:
        assert Path(s.location).is_relative_to(tmp_path / "node")


# -- pickling ---------------------------------------------------------------------------------


def test_a_store_pickles_as_its_location(
    store_dir: Path, namespace: Path, keys: list[str], tmp_path: Path
) -> None:
    stores = [
        tsc.open_store(store_dir),
        tsc.open_store(namespace),
        tsc.open_store(store_dir, local_copy="always", cache_dir=tmp_path / "node"),
    ]
    for store in stores:
        blob = pickle.dumps(store)
        assert len(blob) < 1000, len(blob)
        again = pickle.loads(blob)
        assert type(again.location) is str and again.location == store.location
        np.testing.assert_array_equal(again.stack(keys), expected(keys))
        again.close()
        store.close()


# -- one open per thing -------------------------------------------------------------------------


def test_a_warm_cached_call_parses_namespace_json_once(
    keys: list[str], namespace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorstore_cache.fs import parse_json_fd as parse

    parsed: Counter[str] = Counter()

    def counting(fd: int, path: Any, **kw: Any) -> Any:
        parsed[Path(path).name] += 1
        return parse(fd, path, **kw)

    monkeypatch.setattr("tensorstore_cache.cache.namespace.parse_json_fd", counting)
    store = tsc.cached(keys, loader=LogLoader(tmp_path / "log"), cache_dir=tmp_path / "cache",
                       workers=1, progress=False)
    assert parsed["namespace.json"] == 1
    assert len([n for n in parsed if n.endswith(".json") and n[0].isdigit()]) == 1  # a manifest
    store.close()


def test_opening_a_url_reads_its_metadata_and_opens_its_node_directory_once(
    store_dir: Path, keys: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorstore_cache.remote import copy as copy_module
    from tensorstore_cache.remote import fetch as fetch_module
    from tensorstore_cache.remote import urls

    node = tmp_path / "node"
    read = GroupMetadata.read.__func__  # type: ignore[attr-defined]
    open_url_dir = urls.open_url_dir
    reads: list[str] = []
    dirs: list[str] = []

    def reading(cls: Any, root: Path, *args: Any, **kw: Any) -> Any:
        reads.append(str(root))
        return read(cls, root, *args, **kw)

    def opening(*args: Any, **kw: Any) -> int:
        dirs.append(str(args[0]))
        return open_url_dir(*args, **kw)

    monkeypatch.setattr(GroupMetadata, "read", classmethod(reading))
    monkeypatch.setattr(copy_module, "open_url_dir", opening)
    monkeypatch.setattr(fetch_module, "open_url_dir", opening)
    for cold in (True, False):  # the first open downloads the version, the second finds it
        reads.clear()
        dirs.clear()
        with tsc.open_store(store_dir, local_copy="always", cache_dir=node) as store:
            np.testing.assert_array_equal(store[keys[3]], expected(keys[3:4])[0])
            version = store.location
        # the version directory's metadata is read once (a download also checks what it got)
        assert reads.count(version) == 1, reads
        assert cold or reads == [version], reads
        assert len(dirs) == 1, dirs
