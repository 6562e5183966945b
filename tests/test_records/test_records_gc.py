"""gc beside readers of stores of records: a cache namespace, and a copy in the node cache.

Readers are real processes (spawned); gc runs to completion while they hold their stores.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.format.metadata import GroupMetadata, fetched_files

from ..conftest import gc_under_reader
from ..support._records import FIELDS, RecordLoader, build_box_store, expected, same, write_sources

JOIN_S = 120


def _records_reader(cache: str, keys: list[str], ready: Any, go: Any, out: str) -> None:
    store = tsc.cached(keys, cache_dir=cache, loader=RecordLoader(), loader_id="rec/1",
                       fields=FIELDS, progress=False)
    first = [same(store[k], expected(k)) for k in keys]
    ready.set()
    go.wait(JOIN_S)
    # everything below runs after gc deleted every file of this cache
    again = [same(store[k], expected(k)) for k in keys]
    batch = store.take(np.arange(len(keys)))
    rows = [batch["title_ids"][i].tolist() for i in range(len(keys))]
    with open(out, "wb") as f:
        pickle.dump((first, again, rows, batch["title"], batch["image"]), f)


def test_a_reader_of_a_records_namespace_survives_gc_of_its_files(tmp_path: Path) -> None:
    keys = write_sources(tmp_path / "src", 300)
    cache = tmp_path / "cache"
    tsc.cached(keys, cache_dir=cache, loader=RecordLoader(), loader_id="rec/1", fields=FIELDS,
               workers=2, progress=False).close()
    out = str(tmp_path / "reader.pickle")
    gc_under_reader(_records_reader, cache, keys, out, JOIN_S)
    with open(out, "rb") as f:
        first, again, rows, titles, images = pickle.load(f)
    assert first == again == [True] * len(keys)
    assert rows == [expected(k)["title_ids"].tolist() for k in keys]
    assert titles == [expected(k)["title"] for k in keys]
    np.testing.assert_array_equal(images, np.stack([expected(k)["image"] for k in keys]))


def test_gc_of_a_records_copy_in_the_node_cache_spares_what_a_reader_maps(
    tmp_path: Path,
) -> None:
    keys, local = build_box_store(tmp_path, 2_000)
    meta = GroupMetadata.read(local)
    data = fetched_files(meta.spec)
    cache = tmp_path / "cache"
    url = f"local://{local}"
    open_one = tsc.open_store(url, cache_dir=cache)
    assert same(open_one[keys[1]], expected(keys[1], boxes=True))  # maps a file of each field
    (version,) = [v for v in (cache / "remote").glob("*/*") if v.is_dir()]
    mapped = {rel for rel in data if (version / rel).exists()}
    assert len(mapped) == len(meta.spec.fields)
    closed = tsc.open_store(url, cache_dir=cache)
    assert closed.prefetch().result() == len(data) - len(mapped)
    closed.close()
    removed = tsc.gc(cache, max_bytes=0)
    shards = {Path(r.path).relative_to(version).as_posix() for r in removed
              if r.kind == "remote-shard"}
    assert shards == set(data) - mapped  # every data file of every field nobody maps
    assert not [r for r in removed if r.kind == "remote-version"]  # open: kept
    assert {rel for rel in data if (version / rel).exists()} == mapped
    # the offsets and shapes came with the index: kept with the version
    assert (version / "fields/boxes/offsets/c/0").is_file()
    assert (version / "fields/pic/shapes/c/0/0").is_file()
    # evicted files are fetched again when read; the mapped ones never went away
    for k in (keys[1], keys[1_500], keys[1_999]):
        assert same(open_one[k], expected(k, boxes=True))
    open_one.close()
    removed = tsc.gc(cache, older_than=0)
    assert [r.kind for r in removed] == ["remote-version"] and removed[0].path == str(version)
    with tsc.open_store(url, cache_dir=cache) as again:
        assert same(again[keys[7]], expected(keys[7], boxes=True))


@pytest.mark.filterwarnings("ignore::tensorstore_cache.CacheLimitWarning")
def test_the_node_cache_evicts_the_files_of_records_least_recently_used_first(
    tmp_path: Path,
) -> None:
    _keys, local = build_box_store(tmp_path, 2_000)
    meta = GroupMetadata.read(local)
    image = meta.spec.fields[0]
    cache = tmp_path / "cache"
    url = f"local://{local}"
    with tsc.open_store(url, cache_dir=cache) as store:  # early files of every field
        store.take(np.arange(0, 300))
    with tsc.open_store(url, cache_dir=cache) as store:  # then late ones
        store.take(np.arange(1_700, 2_000))
    (version,) = [v for v in (cache / "remote").glob("*/*") if v.is_dir()]
    early = image.chunk_key(0)
    late = image.chunk_key(image.shard_count() - 1)
    assert (version / early).is_file() and (version / late).is_file()
    size = sum(meta.files[rel][0] for rel in fetched_files(meta.spec)
               if (version / rel).exists())
    removed = tsc.gc(cache, max_bytes=1)
    # nothing open: gc takes everything, by size alone: the least recently used data files
    # first (of every field), the version last
    kinds = [r.kind for r in removed]
    assert kinds[:-1] == ["remote-shard"] * (len(kinds) - 1) and kinds[-1] == "remote-version"
    paths = [r.path for r in removed]
    assert paths.index(str(version / early)) < paths.index(str(version / late))
    assert sum(r.bytes for r in removed[:-1]) == size
