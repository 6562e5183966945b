"""The reader's shard-supply protocol, checked against every supply: one conformance suite.

A supply (:class:`tensorstore_cache.reader.supply.ShardSupply`) makes data
files (named by id: shards of fixed fields, chunks of ragged values) present
before the reader maps them and gets each one back when the reader unmaps it.
The same tests run against the node cache
(:class:`~tensorstore_cache.remote.shards.NodeShards`, over a ``local://``
copy) and a local fake that copies files from a complete store, each wrapped
in a recorder that checks the protocol as the reader uses it, for a store of
tensors and for a store of records (every kind of field):

* ``ensure`` is asked only for shards not mapped now, all the missing shards of
  a read at once, and returns with their files complete;
* ``release(k)`` gives back one ``ensure`` of ``k`` (never more);
* under a budget, at most ``budget`` shards stay mapped (held) between reads;
* ``close`` comes once, when the store closes.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.format.metadata import (
    GroupMetadata,
    fetched_files,
    first_file_ids,
    shard_count,
    shard_key,
)
from tensorstore_cache.fs import RangeHolds
from tensorstore_cache.fs.trust import Trust
from tensorstore_cache.reader import view_of
from tensorstore_cache.reader.assembly import SegmentSource, assemble
from tensorstore_cache.reader.store import CacheStore
from tensorstore_cache.reader.supply import FetchStats, ShardSupply
from tensorstore_cache.remote.fetch import fetch_store
from tensorstore_cache.remote.node_cache import HOLDS_SUFFIX
from tensorstore_cache.remote.shards import NodeShards

N = 600


def vec(key: str) -> Any:
    i = int(key.rsplit("k", 1)[1])
    return np.full(64, i, np.float32)  # 256 bytes a row, 16 rows a 4 KiB shard


class Recorder:
    """Wraps a supply; records and checks how the reader uses it."""

    def __init__(self, inner: ShardSupply, local: Path, meta: GroupMetadata) -> None:
        self.inner = inner
        self.local = local
        self.meta = meta
        self.stats: FetchStats = inner.stats
        self.held: Counter[int] = Counter()
        self.batches: list[list[int]] = []
        self.most_held = 0
        self.closed = 0

    @property
    def budget(self) -> int | None:
        return self.inner.budget

    def ensure(self, shards: Sequence[int]) -> None:
        assert self.closed == 0
        assert len(set(shards)) == len(shards), f"a shard asked twice in one batch: {shards}"
        self.inner.ensure(shards)
        self.batches.append(list(shards))
        rels = fetched_files(self.meta.spec)
        for k in shards:
            rel = rels[k]
            assert (self.local / rel).stat().st_size == self.meta.files[rel][0], rel
            self.held[k] += 1

    def prefetch(self, shards: Sequence[int], *, background: bool = False) -> Future[int]:
        return self.inner.prefetch(shards, background=background)

    def release(self, k: int) -> None:
        assert self.held[k] > 0, f"shard {k} released more often than it was ensured"
        self.held[k] -= 1
        if not self.held[k]:
            del self.held[k]
        self.inner.release(k)

    def close(self) -> None:
        self.closed += 1
        self.inner.close()

    def note(self) -> None:
        """After a read: how many shards the reader keeps."""
        self.most_held = max(self.most_held, sum(self.held.values()))


class CopyingSupply:
    """The local fake: copies shard files in from a complete store."""

    def __init__(self, source: Path, root: Path, meta: GroupMetadata, budget: int | None) -> None:
        self.source, self.root, self.meta = source, root, meta
        self.budget = budget
        self.stats = FetchStats()

    def ensure(self, shards: Sequence[int]) -> None:
        rels = fetched_files(self.meta.spec)
        for k in shards:
            rel = rels[k]
            if not (self.root / rel).exists():
                (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.source / rel, self.root / rel)
                self.stats.shards += 1
            else:
                self.stats.hits += 1

    def prefetch(self, shards: Sequence[int], *, background: bool = False) -> Future[int]:
        before = self.stats.shards
        self.ensure(shards)
        done: Future[int] = Future()
        done.set_result(self.stats.shards - before)
        return done

    def release(self, k: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Where:
    root: str

    @property
    def shown(self) -> str:
        return self.root

    def open(self) -> CacheStore:
        raise NotImplementedError("not pickled in these tests")


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("full") / "s.tsc"
    tsc.build_store([f"k{i}" for i in range(N)], root, loader=vec, loader_id="vec64/1",
                    workers=1, progress=False, shard_bytes=4096, identity="none").close()
    return root


Opener = Callable[[Path, int | None], tuple[CacheStore, list[Recorder]]]


def fake(full: Path, tmp: Path) -> Opener:
    def open_(work: Path, budget: int | None) -> tuple[CacheStore, list[Recorder]]:
        sparse = work / "sparse.tsc"
        shutil.copytree(full, sparse)
        meta = GroupMetadata.read(sparse)
        for rel in fetched_files(meta.spec):
            (sparse / rel).unlink()
        made: list[Recorder] = []

        def supply(m: GroupMetadata) -> Recorder:
            made.append(Recorder(CopyingSupply(full, sparse, m, budget), sparse, m))
            return made[-1]

        store = assemble(Where(str(sparse)), [SegmentSource(
            root=sparse, trust=Trust.explicit(sparse), supply=supply)])
        return store, made

    return open_


def node_cache(full: Path, tmp: Path) -> Opener:
    def open_(work: Path, budget: int | None) -> tuple[CacheStore, list[Recorder]]:
        url = f"local://{full}"
        trust = Trust.private()
        local = fetch_store(url, cache_dir=work / "cache", trust=trust)
        holds = RangeHolds(local.with_name(local.name + HOLDS_SUFFIX), trust)
        meta = GroupMetadata.read(local)
        shard_size = max(meta.files[rel][0] for rel in fetched_files(meta.spec))
        # a cap that gives the reader the budget asked for (a quarter of what the cap holds)
        cap = None if budget is None else 4 * budget * shard_size
        made: list[Recorder] = []

        def supply(m: GroupMetadata) -> Recorder:
            inner = NodeShards(url, local, m, holds=holds, max_bytes=cap, trust=trust)
            assert inner.budget == budget
            made.append(Recorder(inner, local, m))
            return made[-1]

        store = assemble(Where(str(local)), [SegmentSource(root=local, trust=trust,
                                                           supply=supply)])
        return store, made

    return open_


@pytest.fixture(params=["node_cache", "local_fake"])
def opener(request: pytest.FixtureRequest, full: Path, tmp_path: Path) -> Iterator[Opener]:
    yield (node_cache if request.param == "node_cache" else fake)(full, tmp_path)


@pytest.mark.filterwarnings("ignore::tensorstore_cache.CacheLimitWarning")  # tiny caps
@pytest.mark.parametrize("budget", [None, 1, 3])
def test_reads_through_a_supply_are_right_and_keep_the_protocol(
    opener: Opener, full: Path, tmp_path: Path, budget: int | None
) -> None:
    reference = tsc.open_store(full)
    store, made = opener(tmp_path, budget)
    (rec,) = made
    count = shard_count(reference.spec)
    rows_per_shard = reference.spec.rows_per_shard
    assert count > 3 * (budget or 1)
    rng = np.random.default_rng(budget or 0)
    for _ in range(15):
        rows = rng.integers(0, N, int(rng.integers(1, 80)))
        np.testing.assert_array_equal(store.take(rows), reference.take(rows))
        rec.note()
        row = int(rng.integers(0, N))
        np.testing.assert_array_equal(store[f"k{row}"], reference.take([row])[0])
        rec.note()
        if budget is not None:
            assert sum(rec.held.values()) <= budget, rec.held
    # every batch asked only for shards not held at the time, each at most once
    assert all(len(b) <= count for b in rec.batches)
    if budget is None:
        assert sorted(k for b in rec.batches for k in b) == sorted(set(rec.held))
        assert all(v == 1 for v in rec.held.values()), "a mapped shard was ensured again"
        # rows are views of the mapped shards
        view = store[f"k{rows_per_shard}"]
        assert view.base is not None and not view.flags.owndata
    else:
        assert rec.most_held <= budget
        copy = store[f"k{rows_per_shard}"]
        assert copy.flags.owndata, "under a budget, rows are copies"
    store.close()
    assert rec.closed == 1


def test_one_read_asks_for_all_its_missing_shards_at_once(
    opener: Opener, full: Path, tmp_path: Path
) -> None:
    reference = tsc.open_store(full)
    s = reference.spec.rows_per_shard
    store, (rec,) = opener(tmp_path, None)
    rows = np.array([0, 2 * s, 1, 2 * s + 1, 5 * s], np.int64)  # shards 0, 2 and 5
    np.testing.assert_array_equal(store.take(rows), reference.take(rows))
    assert rec.batches == [[0, 2, 5]]
    store.take(rows)  # mapped: nothing asked
    float(store[f"k{s}"][0])  # shard 1, on its own
    assert rec.batches == [[0, 2, 5], [1]]
    store.close()


def test_prefetch_makes_shards_present_without_mapping_them(
    opener: Opener, full: Path, tmp_path: Path
) -> None:
    reference = tsc.open_store(full)
    s = reference.spec.rows_per_shard
    store, (rec,) = opener(tmp_path, None)
    got = store.prefetch(np.array([0, 3 * s], np.int64)).result()
    assert got == 2 and rec.batches == [] and not rec.held
    for k in (0, 3):
        rel = shard_key(reference.spec, k)
        assert (rec.local / rel).stat().st_size == rec.meta.files[rel][0]
    np.testing.assert_array_equal(store.take([3 * s]), reference.take([3 * s]))
    assert rec.batches == [[3]]
    assert rec.stats.hits >= 1
    store.close()


# -- stores of records: one supply for every field ---------------------------------------

from ..conftest import assert_same_batch  # noqa: E402
from ..support import _records  # noqa: E402

N_RECORDS = 2_000  # the records of records_store


@pytest.fixture(params=["node_cache", "local_fake"])
def records_opener(
    request: pytest.FixtureRequest, records_store: tuple[list[str], Path], tmp_path: Path
) -> Iterator[Opener]:
    yield (node_cache if request.param == "node_cache" else fake)(records_store[1], tmp_path)


def _owns_memory(a: np.ndarray) -> bool:
    """Whether ``a`` is (a view of) an array that owns its memory: not of a mapped file."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base is None


def _ranges(spec: Any) -> dict[str, range]:
    """The ids of every field's files."""
    firsts = first_file_ids(spec)
    return {f.name: range(firsts[f.name], firsts[f.name] + f.shard_count()) for f in spec.fields}


@pytest.mark.filterwarnings("ignore::tensorstore_cache.CacheLimitWarning")  # tiny caps
@pytest.mark.parametrize("budget", [None, 6, 18])
def test_record_reads_through_a_supply_are_right_and_keep_the_protocol(
    records_opener: Opener, records_store: tuple[list[str], Path], tmp_path: Path,
    budget: int | None,
) -> None:
    paths, full = records_store
    reference = tsc.open_store(full)
    store, made = records_opener(tmp_path, budget)
    (rec,) = made
    ranges = _ranges(reference.spec)
    assert all(len(r) >= 5 for r in ranges.values()), ranges  # several files every field
    shares = {name: array.budget for name, array in view_of(store).segments[0].arrays.items()}
    if budget is None:
        assert set(shares.values()) == {None}
    else:  # the fields share the supply's budget
        assert shares == dict.fromkeys(ranges, max(1, budget // len(ranges)))
    rng = np.random.default_rng(budget or 0)
    for _ in range(12):
        rows = rng.integers(0, N_RECORDS, int(rng.integers(1, 60)))
        assert_same_batch(store.take(rows), reference.take(rows))
        rec.note()
        p = paths[int(rng.integers(0, N_RECORDS))]
        assert _records.same(store[p], _records.expected(p, boxes=True))
        rec.note()
        if budget is not None:  # each field keeps at most its share mapped
            for name, ids in ranges.items():
                share = shares[name]
                assert share is not None
                assert sum(n for k, n in rec.held.items() if k in ids) <= share, name
    asked = [k for b in rec.batches for k in b]
    for batch in rec.batches:  # one read of one field asks for files of that field only
        assert len({name for name, ids in ranges.items() if batch[0] in ids}) == 1
        assert all(any(k in ids and batch[0] in ids for ids in ranges.values()) for k in batch)
    p = paths[N_RECORDS // 2 + 1]  # every ragged field has values (row 1,000 has no boxes)
    record = store[p]
    if budget is None:
        assert sorted(asked) == sorted(set(rec.held))
        assert all(v == 1 for v in rec.held.values()), "a mapped file was ensured again"
        for name in ("image", "title_ids", "boxes", "pic"):  # views of the mapped files
            assert not _owns_memory(record[name]), name
    else:  # copies: nothing the user holds points into a released file
        for name in ("image", "title_ids", "boxes", "pic"):
            assert _owns_memory(record[name]), name
        assert rec.most_held <= sum(shares.values())  # type: ignore[arg-type]
    assert _records.same(record, _records.expected(p, boxes=True))
    store.close()
    assert rec.closed == 1


def test_a_record_read_asks_for_only_the_files_holding_it(
    records_opener: Opener, records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, full = records_store
    reference = tsc.open_store(full)
    spec = reference.spec
    ranges = _ranges(spec)
    store, (rec,) = records_opener(tmp_path, None)
    row = 1_234
    assert _records.same(store[paths[row]], _records.expected(paths[row], boxes=True))
    want = set()
    for layout in spec.fields:  # the file of each field that holds the row
        if layout.kind == "fixed":
            want.add(ranges[layout.name][row // layout.rows_per_shard])
        else:
            start, stop = view_of(reference).segments[0].ragged(layout.name).spans(np.array([row]))
            if stop[0] > start[0]:
                first, last = int(start[0]) // layout.chunk, int(stop[0] - 1) // layout.chunk
                want.update(ranges[layout.name][first : last + 1])
    assert sorted(k for b in rec.batches for k in b) == sorted(want)
    assert rec.stats.shards + rec.stats.hits >= len(want)
    # a batch: one ask per field, of all its missing files at once
    rec.batches.clear()
    rows = np.array([0, 700, 1_999], np.int64)
    assert_same_batch(store.take(rows), reference.take(rows))
    assert len(rec.batches) <= len(ranges)
    store.close()


def test_prefetch_of_records_makes_every_field_present_without_mapping(
    records_opener: Opener, records_store: tuple[list[str], Path], tmp_path: Path
) -> None:
    _paths, full = records_store
    reference = tsc.open_store(full)
    store, (rec,) = records_opener(tmp_path, None)
    rows = np.array([5, 1_500], np.int64)
    got = store.prefetch(rows).result()
    assert got >= len(reference.spec.fields) and rec.batches == [] and not rec.held
    local = rec.local
    present = {rel for rel in fetched_files(reference.spec) if (local / rel).exists()}
    assert len(present) == got
    assert_same_batch(store.take(rows), reference.take(rows))
    assert {fetched_files(reference.spec)[k] for b in rec.batches for k in b} == present
    assert store.prefetch().result() == len(fetched_files(reference.spec)) - got
    store.close()
