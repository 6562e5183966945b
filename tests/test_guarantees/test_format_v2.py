"""The committed data of on-disk format 2 (``tests/data/format_v2/``): read, and written again.

``tests/data/make_format_v2.py`` wrote it once (its docstring says what it
holds): a store of records with a fixed, a ragged 1-D, a ragged
multi-dimensional and a text field, and a cache namespace of two parts. As
for format 1 (``test_format_v1.py``, whose comparison this reuses), every test
works on a copy, the reader keeps reading these files, and
:func:`test_a_rebuild_writes_the_same_bytes` fails as soon as the writer
writes one byte differently.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import tensorstore_cache as tsc
from tensorstore_cache.reader import view_of

from ..data.make_format_v2 import (
    DATA,
    FIELDS,
    FIRST_NS,
    LOADER,
    ROW_KEYS,
    SECOND_NS,
    SKIPPED,
    build_all,
)
from .test_format_v1 import _PART_ID, _files, _normalised, exact, namespace_dir

GENERATED = ("records.store", "cache")
NS_KEYS = ("sources/ns/a.json", "sources/ns/b.json", "sources/ns/c.json", "sources/ns/d.json")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A copy of the committed data (never opened in place)."""
    copy = tmp_path / "format_v2"
    shutil.copytree(DATA, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def same_record(got: Any, want: dict[str, Any]) -> bool:
    """Every field of a stored record equals the loader's, exactly."""
    return list(got) == list(FIELDS) and all(
        got[name] == want[name] if name == "name" else exact(got[name], want[name])
        for name in FIELDS
    )


def test_the_committed_data_is_there() -> None:
    for name in GENERATED:
        assert (DATA / name).is_dir(), f"{DATA / name} is missing"
    for key in (*ROW_KEYS, *NS_KEYS, "sources/ns/c.first.json", "sources/ns/c.second.json"):
        assert (DATA / key).is_file(), f"{DATA / key} is missing"
    assert len(list(namespace_dir(DATA).glob("parts/*/zarr.json"))) == 2


def test_a_store_of_format_2_returns_its_records(data: Path) -> None:
    kept = [k for k in ROW_KEYS if k != SKIPPED]
    expected = {k: LOADER(str(data / k)) for k in kept}
    with tsc.open_store(data / "records.store") as store:
        spec = store.spec
        assert spec.format_version == 2 and spec.n == len(kept) and store.records
        assert [f.name for f in spec.fields] == list(FIELDS)
        assert spec.loader_id == LOADER.loader_id
        assert [k for k, _r in spec.skipped] == [SKIPPED]
        assert "is not a record" in spec.skipped[0][1]
        assert store.paths == kept and SKIPPED not in store
        for key in kept:
            assert same_record(store[key], expected[key]), key
        order = kept[::-1]
        batch = store.take(store.rows(order))
        assert exact(batch["vec"], np.stack([expected[k]["vec"] for k in order]))
        assert batch["name"] == [expected[k]["name"] for k in order]
        for name in ("ids", "pic"):
            assert all(exact(batch[name][i], expected[k][name]) for i, k in enumerate(order))
        assert store.lengths("ids").tolist() == [len(expected[k]["ids"]) for k in kept]
        assert store.lengths("pic").tolist() == [expected[k]["pic"].shape[0] for k in kept]
        recorded = view_of(store).source_identity(store.rows(kept))
        assert recorded.mtime_ns.tolist() == [FIRST_NS] * len(kept)
        assert tsc.verify_store(store).ok
    assert len(list((data / "records.store/fields/vec/c").iterdir())) == 3, "three shards"


def test_a_namespace_of_format_2_returns_its_latest_records(data: Path) -> None:
    ns = data / "sources" / "ns"
    with tsc.open_store(namespace_dir(data)) as store:
        assert len(view_of(store).segments) == 2
        assert sorted(store.paths) == sorted(NS_KEYS) and store.spec.format_version == 2
        for key in NS_KEYS:
            assert same_record(store[key], LOADER(str(data / key))), key
        second = LOADER(str(ns / "c.second.json"))
        assert not same_record(store["sources/ns/c.json"], LOADER(str(ns / "c.first.json")))
        assert same_record(store["sources/ns/c.json"], second)
        recorded = view_of(store).source_identity(store.rows(list(NS_KEYS)), content_hash=True)
        assert recorded.mtime_ns.tolist() == [FIRST_NS, FIRST_NS, SECOND_NS, FIRST_NS]
        assert recorded.content_hash is not None
        hashes = [0, 0] + [xxhash.xxh3_64_intdigest((data / k).read_bytes()) for k in NS_KEYS[2:]]
        assert recorded.content_hash.tolist() == hashes
        assert tsc.verify_store(store).ok


def test_cached_reuses_a_namespace_of_format_2(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in NS_KEYS:
        os.utime(data / key, ns=(FIRST_NS, FIRST_NS))
    os.utime(data / "sources/ns/c.json", ns=(SECOND_NS, SECOND_NS))
    for path in [data / "cache", *(data / "cache").rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o022)
    ns = namespace_dir(data)
    before = sorted(p.name for p in (ns / "parts").iterdir())
    manifests = sorted(p.name for p in (ns / "manifests").iterdir())
    monkeypatch.chdir(data)
    for identity in ("stat", "content"):
        with tsc.cached(list(NS_KEYS), cache_dir=data / "cache", loader=LOADER, fields=FIELDS,
                        workers=1, progress=False, identity=identity) as store:
            assert sorted(store.paths) == sorted(NS_KEYS)
            assert store.stale(identity=identity) == []
            for key in NS_KEYS:
                assert same_record(store[key], LOADER(key)), key
    assert sorted(p.name for p in (ns / "parts").iterdir()) == before
    assert sorted(p.name for p in (ns / "manifests").iterdir()) == manifests


def test_a_rebuild_writes_the_same_bytes(tmp_path: Path) -> None:
    again = tmp_path / "again"
    again.mkdir()
    shutil.copytree(DATA / "sources", again / "sources")
    build_all(again)
    committed, rebuilt = _normalised(DATA, GENERATED), _normalised(again, GENERATED)
    assert sorted(rebuilt) == sorted(committed)
    differ = [rel for rel in committed if committed[rel] != rebuilt[rel]]
    assert differ == [], f"the writer now writes other bytes in {differ}: a new format version?"
    raw_committed, raw_rebuilt = _files(DATA, GENERATED), _files(again, GENERATED)
    plain = [rel for rel in raw_committed if not _PART_ID.search(rel)
             and rel in raw_rebuilt and not rel.endswith("zarr.json") and "/manifests/" not in rel]
    assert plain and all(raw_committed[rel] == raw_rebuilt[rel] for rel in plain)
