"""Stores of records at URLs: read field file by field file through the node cache, and built
by tasks that upload as they go.

A store of records has data files of every field: the shards of each fixed field and the
chunks of each ragged or text field's values. Opening it from a URL fetches the metadata,
the index and the (small) offsets and shapes of ragged fields; a read fetches only the data
files that hold its rows. Everything runs against a real S3 API (moto, served by another
process that counts every request: ``benchmarks.common.s3server``) and ``local://`` copies; readers
are real processes (fork and spawn). A build to a URL has its shard tasks upload the shards
of fixed fields and the runs of ragged ones; the builder assembles the chunks and uploads
them with the index, the group ``zarr.json`` last; a failed build deletes what it sent.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.common.s3server import S3Process
from tensorstore_cache.format.metadata import GroupMetadata, fetched_files
from tensorstore_cache.reader import view_of

from ..conftest import assert_same_batch
from ..support import _records

REPO = Path(__file__).resolve().parents[2]
N = 2_000  # the records of records_store
SHARD_BYTES = _records.SHARD_BYTES  # a few KiB a data file: several files in every field
BUCKET = "records"
URL = f"s3://{BUCKET}/r.tsc"
PREFIX = f"{BUCKET}/r.tsc/"


@pytest.fixture(scope="module")
def uploaded(
    s3: S3Process, records_store: tuple[list[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The store built to S3 by two processes, and what was asked of the server meanwhile."""
    paths, _local = records_store
    base = tmp_path_factory.mktemp("uploaded")
    log = base / "calls.log"
    s3.reset()
    store = tsc.build_store(
        paths, URL, loader=_records.RecordLoader(log, boxes=True), loader_id="rec/1",
        fields=_records.BOX_FIELDS, workers=2, progress=False, shard_bytes=SHARD_BYTES,
        cache_dir=base / "builder", storage_options=s3.storage_options(),
    )
    puts = s3.requests("PUT", under=PREFIX)
    meta = GroupMetadata.read(Path(store.location))
    pids = {line.split()[0] for line in log.read_text().splitlines()}
    store.close()
    return {"options": s3.storage_options(), "meta": meta, "puts": puts, "pids": pids,
            "builder": base / "builder"}


def _files_of(meta: GroupMetadata, offsets: dict[str, np.ndarray], rows: list[int]) -> set[str]:
    """The data files holding ``rows``: one shard of each fixed field, and the chunks of the
    values of each ragged or text field (none for an empty row)."""
    out = set()
    for layout in meta.spec.fields:
        for row in rows:
            if layout.kind == "fixed":
                out.add(layout.chunk_key(row // layout.rows_per_shard))
                continue
            start, stop = int(offsets[layout.name][row]), int(offsets[layout.name][row + 1])
            if stop > start:
                out.update(layout.chunk_key(k)
                           for k in range(start // layout.chunk, (stop - 1) // layout.chunk + 1))
    return out


def _offsets(local: Path) -> dict[str, np.ndarray]:
    with tsc.open_store(local) as store:
        return {f.name: np.array(view_of(store).segments[0].ragged(f.name).offsets)
                for f in store.spec.fields if f.kind != "fixed"}


def _data_bytes(version: Path, meta: GroupMetadata) -> int:
    return sum(meta.files[rel][0] for rel in fetched_files(meta.spec) if (version / rel).exists())


def _version(cache: Path) -> Path:
    (version,) = [p for p in (cache / "remote").glob("*/*") if p.is_dir()
                  and not p.name.startswith(".")]
    return version


def _cache_bytes(cache: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(cache / "remote"):
        for name in names:
            if name in ("usage", "limit.json", "evict.lock") or name.endswith((".holds", ".lock")):
                continue  # bookkeeping, a few bytes
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total


# -- building to a URL ------------------------------------------------------------------------


def test_tasks_upload_fixed_shards_and_ragged_runs_and_the_group_goes_last(
    s3: S3Process, uploaded: dict[str, Any], records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, local = records_store
    meta: GroupMetadata = uploaded["meta"]
    assert len(uploaded["pids"]) == 2  # the builder and its pool's worker loaded records
    puts = uploaded["puts"]
    keys = {r.key[len(PREFIX):] for r in puts}
    fixed = [f for f in meta.spec.fields if f.kind == "fixed"]
    ragged = [f for f in meta.spec.fields if f.kind != "fixed"]
    tasks = -(-N // meta.spec.rows_per_shard)
    assert tasks > 2
    for f in fixed:  # every shard of every fixed field, uploaded by the task that wrote it
        assert {f.chunk_key(k) for k in range(f.shard_count())} <= keys
    for f in ragged:  # every task's run of every ragged field
        assert {f"runs/{f.name}/{k}" for k in range(tasks)} <= keys
        assert {f.chunk_key(k) for k in range(f.shard_count())} <= keys  # chunks: the builder's
    group = [r for r in puts if r.key == f"{PREFIX}zarr.json"]
    assert len(group) == 1
    assert all(r.ended <= group[0].started for r in puts if r is not group[0])
    # what is at the URL is the store, nothing else: the runs are gone
    import s3fs

    fs = s3fs.S3FileSystem(**uploaded["options"], skip_instance_cache=True)
    listed = {p[len(PREFIX):] for p in fs.find(PREFIX.rstrip("/"))}
    assert listed == set(meta.files) | {"zarr.json"}
    # the builder's copy holds the chunks it assembled, not the shards the tasks wrote
    copy = _version(uploaded["builder"])
    assert not list(copy.glob("fields/image/c/*"))
    assert all((copy / f.chunk_key(0)).is_file() for f in ragged)
    assert not (copy / "runs").exists()
    reference = tsc.open_store(local)
    with tsc.open_store(URL, cache_dir=tmp_path / "reader",
                        storage_options=uploaded["options"]) as other:
        assert other.paths == reference.paths
        rows = np.arange(N)
        assert_same_batch(other.take(rows), reference.take(rows))
        for p in paths[::97]:
            assert _records.same(other[p], _records.expected(p, boxes=True))
        other.verify()


READ_ONE = """
import json, sys
import tensorstore_cache as tsc
url, cache, options, key = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
store = tsc.open_store(url, cache_dir=cache, storage_options=options)
rec = store[key]
print(json.dumps({k: (v if isinstance(v, str) else v.tolist()) for k, v in rec.items()}))
"""


def test_a_fresh_process_reading_one_record_fetches_the_index_and_only_its_files(
    s3: S3Process, uploaded: dict[str, Any], records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, local = records_store
    meta: GroupMetadata = uploaded["meta"]
    row = 1_237
    s3.reset()
    proc = subprocess.run(
        [sys.executable, "-c", READ_ONE, URL, str(tmp_path / "cache"),
         json.dumps(uploaded["options"]), paths[row]],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = _records.expected(paths[row], boxes=True)
    assert got == {k: (v if isinstance(v, str) else v.tolist()) for k, v in want.items()}
    gets = s3.requests("GET", PREFIX)
    data = set(fetched_files(meta.spec))
    fetched = sorted(r.key[len(PREFIX):] for r in gets if r.key[len(PREFIX):] in data)
    needed = _files_of(meta, _offsets(local), [row])
    assert len(needed) >= len(meta.spec.fields) - 1  # one file a field (no boxes is possible)
    assert fetched == sorted(needed)  # those, once each
    rest = [r.key[len(PREFIX):] for r in gets if r.key[len(PREFIX):] not in data]
    assert len(rest) == len(set(rest))  # metadata, index, offsets and shapes: once each
    assert set(rest) == (set(meta.files) - data) | {"zarr.json"}
    assert {"fields/title_ids/offsets/c/0", "fields/pic/shapes/c/0/0"} <= set(rest)
    version = _version(tmp_path / "cache")
    present = {rel for rel in data if (version / rel).exists()}
    assert present == needed


def test_prefetch_then_verify_a_remote_store_of_records(
    s3: S3Process, uploaded: dict[str, Any], records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    _paths, local = records_store
    meta: GroupMetadata = uploaded["meta"]
    reference = tsc.open_store(local)
    store = tsc.open_store(URL, cache_dir=tmp_path / "cache", storage_options=uploaded["options"])
    rows = np.array([3, 900, 1_999])
    s3.reset()
    assert_same_batch(store.take(rows), reference.take(rows))
    needed = _files_of(meta, _offsets(local), rows.tolist())
    stats = store.fetch_stats
    assert stats is not None and stats.shards == len(needed)
    assert store.prefetch(rows).result() == 0  # all there
    more = np.array([450])
    extra = _files_of(meta, _offsets(local), [450]) - needed
    assert store.prefetch(more).result() == len(extra)
    data = fetched_files(meta.spec)
    done = store.prefetch(background=True)
    assert done.result(timeout=120) == len(data) - len(needed) - len(extra)
    gets = [r.key for r in s3.requests("GET", PREFIX) if r.key[len(PREFIX):] in set(data)]
    assert sorted(gets) == sorted(PREFIX + rel for rel in data)  # every data file, once
    store.verify()
    assert_same_batch(store.take(np.arange(N)), reference.take(np.arange(N)))
    store.close()


@pytest.mark.filterwarnings("error::tensorstore_cache.CacheLimitWarning")
def test_a_capped_node_cache_holds_while_every_record_is_read(
    uploaded: dict[str, Any], records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, local = records_store
    meta: GroupMetadata = uploaded["meta"]
    reference = tsc.open_store(local)
    cache = tmp_path / "cache"
    with tsc.open_store(URL, cache_dir=cache, storage_options=uploaded["options"]):
        index = _cache_bytes(cache)  # metadata, index, offsets and shapes
    data = fetched_files(meta.spec)
    largest = max(meta.files[rel][0] for rel in data)
    everything = sum(meta.files[rel][0] for rel in data)
    cap = index + 24 * largest
    assert everything > 2 * (cap - index)  # the data does not fit: files are evicted
    store = tsc.open_store(URL, cache_dir=cache, storage_options=uploaded["options"],
                           max_bytes=cap)
    arrays = view_of(store).segments[0].arrays
    shares = {name: a.budget for name, a in arrays.items()}
    assert all(s is not None and s >= 1 for s in shares.values())
    holds = view_of(store).segments[0].supply.holds  # type: ignore[union-attr]
    for start in range(0, N, 128):  # an epoch in row order, batches of 128
        rows = np.arange(start, min(N, start + 128))
        assert_same_batch(store.take(rows), reference.take(rows))
        assert _cache_bytes(cache) <= cap
        assert len(holds.held) <= sum(shares.values())  # type: ignore[arg-type]
    record = store[paths[7]]
    for name in ("image", "title_ids", "pic"):  # copies: nothing points into a released file
        value = record[name]
        while isinstance(value.base, np.ndarray):
            value = value.base
        assert value.base is None, name
    assert _records.same(record, _records.expected(paths[7], boxes=True))
    stats = store.fetch_stats
    assert stats is not None and stats.cap == cap and stats.shards >= len(data)
    store.close()
    assert _cache_bytes(cache) <= cap


def _environment_credentials(monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]) -> None:
    """A store pickles without the credentials of its storage_options: the process that
    unpickles it reads with those of its environment (given here)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])


def test_a_pickled_store_of_records_reopens_the_node_copy_without_requests(
    s3: S3Process, uploaded: dict[str, Any], records_store: tuple[list[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _environment_credentials(monkeypatch, uploaded["options"])
    paths, _local = records_store
    store = tsc.open_store(URL, cache_dir=tmp_path / "cache", storage_options=uploaded["options"])
    assert _records.same(store[paths[11]], _records.expected(paths[11], boxes=True))
    s3.reset()
    again = pickle.loads(pickle.dumps(store))
    assert again.location == store.location
    assert _records.same(again[paths[12]], _records.expected(paths[12], boxes=True))
    assert s3.requests("GET", PREFIX) == []  # the node copy holds what rows 11 and 12 need
    assert _records.same(again[paths[1_900]], _records.expected(paths[1_900], boxes=True))
    assert s3.requests("GET", PREFIX)  # that row's files were fetched
    assert pickle.loads(pickle.dumps(store.field("title"))).take(np.array([5, 6])) == [
        "book 5", "book 6"]
    again.close()
    store.close()


def _read_in_child(store: tsc.CacheStore, rows: list[int], out: Any) -> None:
    batch = store.take(np.array(rows))
    flat = {}
    for name, value in batch.items():
        if isinstance(value, tsc.Ragged):
            flat[name] = (value.values, value.offsets)
        else:
            flat[name] = value
    keys = store.paths
    out.put((os.getpid(), flat, [_records.same(store[keys[r]], _records.expected(keys[r], True))
                                 for r in rows]))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_reader_processes_of_a_remote_store_of_records(
    s3: S3Process, uploaded: dict[str, Any], records_store: tuple[list[str], Path], tmp_path: Path,
    method: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _environment_credentials(monkeypatch, uploaded["options"])
    _paths, local = records_store
    meta: GroupMetadata = uploaded["meta"]
    reference = tsc.open_store(local)
    store = tsc.open_store(URL, cache_dir=tmp_path / "cache", storage_options=uploaded["options"])
    store.take(np.arange(0, 200))  # the parent maps some files (forked children inherit them)
    s3.reset()
    ctx: Any = multiprocessing.get_context(method)
    out = ctx.Queue()
    parts = [list(range(100, 1_100, 7)), list(range(150, 1_999, 5)), list(range(1_000, 1_300))]
    procs = [ctx.Process(target=_read_in_child, args=(store, rows, out)) for rows in parts]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len({pid for pid, _flat, _ok in results}) == 3
    by_len = {len(ok): (flat, ok) for _pid, flat, ok in results}
    for rows in parts:
        flat, ok = by_len[len(rows)]
        assert all(ok)
        want = reference.take(np.array(rows))
        for name, value in want.items():
            if isinstance(value, tsc.Ragged):
                np.testing.assert_array_equal(flat[name][0], value.values)
                np.testing.assert_array_equal(flat[name][1], value.offsets)
            elif isinstance(value, list):
                assert flat[name] == value
            else:
                np.testing.assert_array_equal(flat[name], value)
    # the children shared the node cache: each data file was downloaded once
    data = set(fetched_files(meta.spec))
    gets = [r.key for r in s3.requests("GET", PREFIX) if r.key[len(PREFIX):] in data]
    assert len(gets) == len(set(gets)) > 0
    already = _files_of(meta, _offsets(local), list(range(200)))
    assert not {g[len(PREFIX):] for g in gets} & already  # the parent's were not fetched again
    assert_same_batch(store.take(np.arange(N)), reference.take(np.arange(N)))
    store.close()


def test_a_damaged_chunk_names_its_url_and_the_other_fields_still_read(
    s3: S3Process, records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    import s3fs

    paths, _local = records_store
    url = f"s3://{BUCKET}/damaged.tsc"
    options = s3.storage_options()
    tsc.build_store(paths[:300], url, loader=_records.RecordLoader(boxes=True), loader_id="rec/1",
                    fields=_records.BOX_FIELDS, workers=1, progress=False,
                    shard_bytes=SHARD_BYTES, cache_dir=tmp_path / "b",
                    storage_options=options).close()
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    obj = f"{BUCKET}/damaged.tsc/fields/title/values/c/0"
    raw = bytearray(fs.cat_file(obj))
    raw[10] ^= 0xFF
    fs.pipe_file(obj, bytes(raw))
    cache = tmp_path / "cache"
    store = tsc.open_store(url, cache_dir=cache, storage_options=options)
    np.testing.assert_array_equal(store.field("title_ids").take(np.array([3]))[0],
                                  _records.expected(paths[3])["title_ids"])
    with pytest.raises(tsc.CorruptStoreError) as info:
        store[paths[3]]
    assert info.value.path == f"{url}/fields/title/values/c/0"
    assert not isinstance(info.value, tsc.StoreReplacedError)
    assert not list(cache.glob("remote/*/*/fields/title/values/c/0"))
    assert not list(cache.glob("remote/*/.*.tsc-fetch-*"))
    store.close()


# -- local:// copies ---------------------------------------------------------------------------


def test_a_local_url_copy_of_records_fetches_fields_as_read(
    records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, local = records_store
    meta = GroupMetadata.read(local)
    data = set(fetched_files(meta.spec))
    cache = tmp_path / "cache"
    store = tsc.open_store(f"local://{local}", cache_dir=cache)
    version = _version(cache)
    assert Path(store.location) == version
    assert {rel for rel in meta.files if (version / rel).exists()} == set(meta.files) - data
    rows = [17, 1_500]
    reference = tsc.open_store(local)
    assert_same_batch(store.take(np.array(rows)), reference.take(np.array(rows)))
    assert {rel for rel in data if (version / rel).exists()} == _files_of(meta, _offsets(local),
                                                                          rows)
    for p in paths[::211]:
        assert _records.same(store[p], _records.expected(p, boxes=True))
    # a field alone, then the whole store through local_copy="always"
    np.testing.assert_array_equal(store.field("rating").take(np.arange(N)),
                                  reference.field("rating").take(np.arange(N)))
    store.verify()
    with tsc.open_store(local, cache_dir=tmp_path / "other", local_copy="always") as copied:
        assert Path(copied.location).is_relative_to(tmp_path / "other" / "remote")
        assert copied.frame(paths[:5]).equals(reference.frame(paths[:5]))


def test_lengths_come_from_the_offsets_without_fetching_values(
    records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, local = records_store
    meta = GroupMetadata.read(local)
    cache = tmp_path / "cache"
    store = tsc.open_store(f"local://{local}", cache_dir=cache)
    want = [_records.expected(p, boxes=True) for p in paths]
    np.testing.assert_array_equal(store.lengths("title_ids"), [len(w["title_ids"]) for w in want])
    np.testing.assert_array_equal(store.lengths("boxes"), [len(w["boxes"]) for w in want])
    np.testing.assert_array_equal(store.lengths("pic"), [w["pic"].shape[1] for w in want])
    np.testing.assert_array_equal(store.lengths("title", [3, 1_000]), [6, 9])  # UTF-8 bytes
    version = _version(cache)
    assert not [rel for rel in fetched_files(meta.spec) if (version / rel).exists()]
    batch = store.take(np.array([3, 1_000]))
    np.testing.assert_array_equal(batch["pic"].lengths, store.lengths("pic", [3, 1_000]))
    with pytest.raises(TypeError, match="ragged or text field"):
        store.lengths("rating")
    with pytest.raises(IndexError):
        store.lengths("title", [N])


# -- failures of builds to a URL ------------------------------------------------------------


def _listed(options: dict[str, Any], prefix: str) -> set[str]:
    import s3fs

    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    fs.invalidate_cache()
    return {p.split(f"{prefix}/", 1)[1] for p in fs.find(f"{BUCKET}/{prefix}")}


def test_a_failed_build_of_records_deletes_its_shards_and_runs(
    s3: S3Process, records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, _local = records_store
    url = f"s3://{BUCKET}/failed.tsc"
    s3.reset()
    with pytest.raises(tsc.BuildError, match="1 of 2000 sources") as err:
        tsc.build_store(paths, url, loader=_records.RecordLoader(boxes=True, fail=(1_000,)),
                        loader_id="rec/1", fields=_records.BOX_FIELDS, workers=2, progress=False,
                        shard_bytes=SHARD_BYTES, cache_dir=tmp_path / "b",
                        storage_options=s3.storage_options())
    assert "source 1000 is unreadable" in str(err.value)
    sent = {r.key for r in s3.requests("PUT", under=f"{BUCKET}/failed.tsc/")}
    assert any("/fields/image/c/" in k for k in sent) and any("/runs/title/" in k for k in sent)
    assert f"{BUCKET}/failed.tsc/zarr.json" not in sent
    assert _listed(s3.storage_options(), "failed.tsc") == set()
    with pytest.raises(tsc.StoreNotFoundError):
        tsc.open_store(url, cache_dir=tmp_path / "r", storage_options=s3.storage_options())
    assert not [p for p in (tmp_path / "b" / "remote").glob("*/.*") if p.is_dir()]


def test_a_worker_killed_mid_build_of_records_leaves_nothing(
    s3: S3Process, records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, _local = records_store
    url = f"s3://{BUCKET}/killed.tsc"
    # the pool's worker takes the first tasks, the builder the last: the worker uploads task
    # 0's shards and runs, then dies in task 1 (85 rows a task here); the builder waits, at
    # its first source, until the worker has started task 1, which it then cannot take back
    loader = _records.RecordLoader(boxes=True, kill=100, builder=os.getpid(),
                                   started=(85, str(tmp_path / "task-1-started")))
    s3.reset()
    with pytest.raises(tsc.BuildError, match="died"):
        tsc.build_store(paths, url, loader=loader, loader_id="rec/1", fields=_records.BOX_FIELDS,
                        workers=2, progress=False, shard_bytes=SHARD_BYTES,
                        cache_dir=tmp_path / "b", storage_options=s3.storage_options())
    sent = {r.key for r in s3.requests("PUT", under=f"{BUCKET}/killed.tsc/")}
    assert f"{BUCKET}/killed.tsc/fields/image/c/0/0/0/0" in sent
    assert f"{BUCKET}/killed.tsc/runs/title_ids/0" in sent
    assert _listed(s3.storage_options(), "killed.tsc") == set()
    assert not [p for p in (tmp_path / "b" / "remote").glob("*/.*") if p.is_dir()]


def test_skip_mode_and_overwrites_of_records_at_a_url(
    s3: S3Process, records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, local = records_store
    url = f"s3://{BUCKET}/skipped.tsc"
    options = s3.storage_options()
    # first a store of tensors there: replaced by records, its arrays deleted
    tsc.build_store(paths[:300], url, loader=_records.number_vector, loader_id="num/1",
                    workers=1, progress=False, cache_dir=tmp_path / "b",
                    storage_options=options).close()
    assert any(k.startswith("vectors/") for k in _listed(options, "skipped.tsc"))
    bad = (0, 999, 1_999)
    store = tsc.build_store(
        paths, url, loader=_records.RecordLoader(boxes=True, fail=bad), loader_id="rec/1",
        fields=_records.BOX_FIELDS, workers=2, progress=False, on_error="skip", overwrite=True,
        shard_bytes=SHARD_BYTES, cache_dir=tmp_path / "b", storage_options=options)
    keep = [i for i in range(N) if i not in bad]
    assert len(store) == len(keep) and len(store.spec.skipped) == 3
    meta = GroupMetadata.read(Path(store.location))
    assert _listed(options, "skipped.tsc") == set(meta.files) | {"zarr.json"}  # no vectors, runs
    reference = tsc.open_store(local)
    with tsc.open_store(url, cache_dir=tmp_path / "r", storage_options=options) as other:
        other.verify()
        assert_same_batch(other.take(np.arange(len(keep))), reference.take(np.array(keep)))
        assert other.paths == [paths[i] for i in keep]
    store.close()
    # and tensors over records: the fields go
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tsc.build_store(paths[:300], url, loader=_records.number_vector, loader_id="num/1",
                        workers=1, progress=False, cache_dir=tmp_path / "b", overwrite=True,
                        storage_options=options).close()
    assert not [k for k in _listed(options, "skipped.tsc") if k.startswith(("fields/", "runs/"))]
