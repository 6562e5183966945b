"""The committed data of on-disk format 1 (``tests/data/format_v1/``): read, and written again.

``tests/data/make_format_v1.py`` wrote it once (its docstring says what it
holds). Every test works on a copy in a temporary directory: opening a cache
namespace writes its ``last_used``. A change of the on-disk format needs a
new format version; the reader keeps reading these files, and
:func:`test_a_rebuild_writes_the_same_bytes` fails as soon as the writer
writes one byte differently.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import xxhash
import zarr

import tensorstore_cache as tsc
from tensorstore_cache.reader import view_of

from ..data.make_format_v1 import (
    DATA,
    FIRST_NS,
    FLOAT32_LOADER,
    NAMESPACE_LOADER,
    ROW_KEYS,
    SECOND_NS,
    SKIPPED,
    UINT8_LOADER,
    RawLoader,
    build_all,
)

STORES = {"float32.store": FLOAT32_LOADER, "uint8.store": UINT8_LOADER}
GENERATED = ("float32.store", "uint8.store", "cache")
NS_KEYS = ("sources/ns/a.bin", "sources/ns/b.bin", "sources/ns/c.bin", "sources/ns/d.bin")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A copy of the committed data (never opened in place)."""
    copy = tmp_path / "format_v1"
    shutil.copytree(DATA, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def namespace_dir(root: Path) -> Path:
    (ns,) = sorted((root / "cache").iterdir())
    return ns


def failure_of(loader: RawLoader, path: Path, key: str) -> str:
    """The reason recorded for a source the loader fails on, computed by calling it."""
    with pytest.raises(ValueError) as info:
        loader(str(path))
    return f"{type(info.value).__name__}: {info.value}".replace(str(path), key)


def exact(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> bool:
    """Same dtype, shape and bytes (NaN payloads and signed zeros included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_the_committed_data_is_there() -> None:
    # a .gitignore pattern or a missing file would leave the directory short in a clone
    for name in GENERATED:
        assert (DATA / name).is_dir(), f"{DATA / name} is missing"
    for key in (*ROW_KEYS, *NS_KEYS, "sources/ns/c.first", "sources/ns/c.second"):
        assert (DATA / key).is_file(), f"{DATA / key} is missing"
    assert len(list(namespace_dir(DATA).glob("parts/*/zarr.json"))) == 2


@pytest.mark.parametrize("name", sorted(STORES))
def test_a_store_of_format_1_returns_its_vectors(data: Path, name: str) -> None:
    loader = STORES[name]
    kept = [k for k in ROW_KEYS if k != SKIPPED]
    expected = {k: loader(str(data / k)) for k in kept}
    with tsc.open_store(data / name) as store:
        spec = store.spec
        assert spec.format_version == 1 == tsc.FORMAT_VERSION
        assert (spec.n, spec.item_shape, spec.dtype) == (len(kept), loader.item_shape, loader.dtype)
        assert (spec.loader_id, spec.loader_params) == (loader.loader_id, loader.params)
        assert spec.skipped == ((SKIPPED, failure_of(loader, data / SKIPPED, SKIPPED)),)
        assert store.paths == kept
        assert SKIPPED not in store and store.get(SKIPPED) is None
        for key in kept:
            # the row is the loader's output, and, this loader being raw, the source's bytes
            assert exact(store[key], expected[key]), key
            assert store[key].tobytes() == (data / key).read_bytes(), key
        batch = store.take(store.rows(kept[::-1]))
        assert exact(batch, np.stack([expected[k] for k in kept[::-1]]))
        recorded = view_of(store).source_identity(store.rows(kept))
        assert recorded.size.tolist() == [(data / k).stat().st_size for k in kept]
        assert recorded.mtime_ns.tolist() == [FIRST_NS] * len(kept)
        assert tsc.verify_store(store).ok
    if name == "float32.store":
        assert len(list((data / name / "vectors" / "c").iterdir())) == 2, "two shards"
    # stock zarr-python reads the same rows
    vectors = zarr.open_array(str(data / name / "vectors"), mode="r")
    assert exact(np.asarray(vectors[:]), np.stack([expected[k] for k in kept]))


def test_a_namespace_of_format_1_returns_its_latest_vectors(data: Path) -> None:
    ns = data / "sources" / "ns"
    with tsc.open_store(namespace_dir(data)) as store:
        assert len(view_of(store).segments) == 2
        assert sorted(store.paths) == sorted(NS_KEYS)
        assert store.spec.format_version == 1 and store.spec.item_shape == (3,)
        for key in NS_KEYS:
            assert exact(store[key], NAMESPACE_LOADER(str(data / key))), key
        # c was computed twice: the second part overrides the first
        second, first = NAMESPACE_LOADER(str(ns / "c.second")), NAMESPACE_LOADER(str(ns / "c.first"))
        assert not exact(second, first)
        assert exact(store["sources/ns/c.bin"], second)
        rows = store.rows(list(NS_KEYS))
        recorded = view_of(store).source_identity(rows, content_hash=True)
        assert recorded.mtime_ns.tolist() == [FIRST_NS, FIRST_NS, SECOND_NS, FIRST_NS]
        assert recorded.content_hash is not None
        # the second call used identity="content": its part records the content of c and d
        hashes = [0, 0] + [xxhash.xxh3_64_intdigest((data / k).read_bytes()) for k in NS_KEYS[2:]]
        assert recorded.content_hash.tolist() == hashes
        assert tsc.verify_store(store).ok


def test_cached_reuses_a_namespace_of_format_1(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the sources get the times recorded at the builds; the cache the modes a cache has
    for key in NS_KEYS:
        os.utime(data / key, ns=(FIRST_NS, FIRST_NS))
    os.utime(data / "sources/ns/c.bin", ns=(SECOND_NS, SECOND_NS))
    for path in [data / "cache", *(data / "cache").rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o022)
    ns = namespace_dir(data)
    before = sorted(p.name for p in (ns / "parts").iterdir())
    manifests = sorted(p.name for p in (ns / "manifests").iterdir())
    monkeypatch.chdir(data)
    for identity in ("stat", "content"):
        with tsc.cached(list(NS_KEYS), cache_dir=data / "cache", loader=NAMESPACE_LOADER,
                        workers=1, progress=False, identity=identity) as store:
            assert sorted(store.paths) == sorted(NS_KEYS)
            assert store.stale(identity=identity) == []
            for key in NS_KEYS:
                assert exact(store[key], NAMESPACE_LOADER(key)), key
    # nothing was computed again: the same parts and manifests
    assert sorted(p.name for p in (ns / "parts").iterdir()) == before
    assert sorted(p.name for p in (ns / "manifests").iterdir()) == manifests


# -- written again: the same bytes -------------------------------------------------
#
# Excluded from the comparison, and only these: "created_unix" (the build's time) in
# each store's group zarr.json and in the manifests, the manifests' "writer"
# (host:pid of the process that published it) and the part ids (time and random
# bits), which name the part directories and their .source_xxh3 side files and are
# listed in the manifests. No file records a hash of a file holding one of them
# (the group zarr.json and the manifests are not in any "files" list), so no recorded
# hash is excluded. Each replacement must match exactly once where it is expected.

_TIME = re.compile(rb'"created_unix": [0-9.eE+-]+')
_WRITER = re.compile(rb'"writer": "[^"]*"')
_PART_ID = re.compile(r"[0-9a-f]{8,16}-[0-9a-f]{8}")


def _files(root: Path, generated: tuple[str, ...] = GENERATED) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for name in generated
        for p in sorted((root / name).rglob("*"))
        if p.is_file()
    }


def _part_ids(root: Path) -> list[str]:
    """The part ids of the namespace, oldest first (the current manifest's order)."""
    manifests = sorted((namespace_dir(root) / "manifests").iterdir())
    parts: list[str] = json.loads(manifests[-1].read_text())["parts"]
    return parts


def _normalised(root: Path, generated: tuple[str, ...] = GENERATED) -> dict[str, bytes]:
    """Every generated file, with the build times, writers and part ids replaced."""
    ids = _part_ids(root)
    assert len(ids) == 2 and all(_PART_ID.fullmatch(i) for i in ids)
    out: dict[str, bytes] = {}
    for rel, raw in _files(root, generated).items():
        for k, part in enumerate(ids):
            rel = rel.replace(part, f"<part{k}>")
            raw = raw.replace(part.encode(), f"<part{k}>".encode())
        is_group = rel.endswith(".store/zarr.json") or re.fullmatch(r".*/parts/<part\d>/zarr\.json", rel)
        is_manifest = "/manifests/" in rel
        raw, times = _TIME.subn(b'"created_unix": <time>', raw)
        assert times == (1 if is_group or is_manifest else 0), rel
        raw, writers = _WRITER.subn(b'"writer": <writer>', raw)
        assert writers == (1 if is_manifest else 0), rel
        assert not _PART_ID.search(rel), f"an unknown part id in {rel}"
        out[rel] = raw
    return out


def test_a_rebuild_writes_the_same_bytes(tmp_path: Path) -> None:
    again = tmp_path / "again"
    again.mkdir()
    shutil.copytree(DATA / "sources", again / "sources")
    build_all(again)
    committed, rebuilt = _normalised(DATA), _normalised(again)
    assert sorted(rebuilt) == sorted(committed)
    differ = [rel for rel in committed if committed[rel] != rebuilt[rel]]
    assert differ == [], f"the writer now writes other bytes in {differ}: a new format version?"
    # the exclusions hide nothing else: the part-id-free files compare exactly as they are
    raw_committed, raw_rebuilt = _files(DATA), _files(again)
    plain = [rel for rel in raw_committed if not _PART_ID.search(rel)
             and rel in raw_rebuilt and not rel.endswith("zarr.json") and "/manifests/" not in rel]
    assert plain and all(raw_committed[rel] == raw_rebuilt[rel] for rel in plain)
