"""The last shards of a build, cut into pieces (``writer/pieces.py``, ``writer/schedule.py``).

A piece's rows, computed by any process, make the same shard file as the shard's own task;
the building process and a worker share the shards left at the end, whose pieces are each
computed once; a real build by two processes equals the build by one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.writer import schedule
from tensorstore_cache.writer.pieces import MIN_PIECE_ROWS, Piece, Tail, run_piece
from tensorstore_cache.writer.tasks import Failure, ShardResult, ShardTask, run_shard

ROWS = 64


def _vec(key: str) -> np.ndarray:
    i = int(Path(key).name.split("-")[1])
    if i % 29 == 13:
        raise ValueError(f"no vector for {i}")
    return np.full((8,), i, np.float32)


def _task(root: Path, k: int, keys: list[str], **given: Any) -> ShardTask:
    (root / "vectors").mkdir(parents=True, exist_ok=True)
    given.setdefault("identity", "none")
    return ShardTask(root=str(root), rel=f"vectors/c/{k}/0", keys=keys, loader=_vec,
                     dtype="float32", item_shape=(8,), rows_per_shard=ROWS,
                     write_on_failure=True, k=k, **given)


def _keys(k: int, m: int = ROWS) -> list[str]:
    return [f"k-{k * ROWS + i}" for i in range(m)]


def _pieces(tail: Tail, tasks: list[ShardTask]) -> list[Piece]:
    units = tail.cut(tasks)
    assert all(isinstance(u, Piece) for u in units)
    return [u for u in units if isinstance(u, Piece)]


def _same(a: ShardResult, b: ShardResult) -> None:
    assert (a.size, a.checksum, a.failures) == (b.size, b.checksum, b.failures)
    assert (a.source_size, a.source_mtime_ns, a.source_hash) == (
        b.source_size, b.source_mtime_ns, b.source_hash)


def test_a_shard_is_cut_into_pieces_of_an_eighth_each_row_once(tmp_path: Path) -> None:
    done = {3: (np.zeros(8, np.float32), (-1, -1, 0)), 40: (Failure("E: x", ""), (-1, -1, 0))}
    task = _task(tmp_path, 0, _keys(0), identity="token", tokens=list(range(ROWS)),
                 computed=dict(done))
    pieces = _pieces(Tail(), [task])
    assert [p.start for p in pieces] == list(range(0, ROWS, ROWS // 8))
    assert [k for p in pieces for k in p.task.keys] == task.keys
    assert [t for p in pieces for t in p.task.tokens or []] == task.tokens
    assert {p.start + i: v for p in pieces for i, v in p.task.computed.items()} == done
    assert all(p.task.rel == task.rel and p.task.k == 0 for p in pieces)
    short = _pieces(Tail(), [_task(tmp_path, 1, _keys(1, 20))])  # none under MIN_PIECE_ROWS
    assert [len(p.task.keys) for p in short] == [MIN_PIECE_ROWS, MIN_PIECE_ROWS, 4]
    small = _task(tmp_path, 2, _keys(2, 2 * MIN_PIECE_ROWS - 1))  # one piece: left whole
    assert Tail().cut([small]) == [small]


def test_a_shard_of_pieces_writes_the_bytes_its_own_task_writes(tmp_path: Path) -> None:
    """Pieces back in any order: the shard is whole after its last one only, and writes the
    same file, failures and source identities as the shard's task run whole."""
    sources = tmp_path / "src"
    sources.mkdir()
    keys = [str(sources / f"k-{i}") for i in range(ROWS)]
    for key in keys[:-2]:  # the last two are missing: not files under identity="stat"
        Path(key).write_text("x")
    whole = run_shard(_task(tmp_path / "a", 0, keys, identity="stat"))
    tail = Tail()
    pieces = _pieces(tail, [_task(tmp_path / "b", 0, keys, identity="stat")])
    assembled = None
    for piece in reversed(pieces):
        assert assembled is None
        assembled = tail.add(piece, run_piece(piece))
    assert assembled is not None and sorted(assembled.computed) == list(range(ROWS))
    _same(run_shard(assembled), whole)
    reasons = [reason.split(":")[0] for _i, reason, _f in whole.failures]
    assert reasons == ["ValueError", "ValueError", "NotAFileError", "NotAFileError"]  # 13, 42


class _Pool:
    """One thread standing for a worker process: it runs what it is sent in order, the
    first task only once ``start`` is set (a worker still starting)."""

    def __init__(self, start: threading.Event) -> None:
        self.ran: list[tuple[str, int | None]] = []
        self.ran_piece = threading.Event()
        self._start = start
        self._executor = ThreadPoolExecutor(1)
        self._sent = 0

    def submit(self, unit: ShardTask | Piece) -> Future[Any]:
        first, self._sent = self._sent == 0, self._sent + 1

        def run() -> Any:
            if first:
                assert self._start.wait(30)
            if isinstance(unit, Piece):
                rows = run_piece(unit, _vec)
                self.ran.append((unit.task.rel, unit.start))
                self.ran_piece.set()
                return rows
            self.ran.append((unit.rel, None))
            return run_shard(unit, _vec)

        return self._executor.submit(run)


def test_the_building_process_and_a_worker_share_the_last_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight shards, a worker that starts late: the building process builds shards 7 to 4
    whole; then the three left (1 to 3, one taken back from the worker) are cut into
    pieces, which the worker (once its first shard, 0, is done) and the building process
    both compute, each once; the building process writes those three, each file the bytes
    of its shard's task run whole."""
    tasks = [_task(tmp_path / "build", k, _keys(k)) for k in range(8)]
    reference = {t.rel: run_shard(_task(tmp_path / "ref", t.k, t.keys)) for t in tasks}
    cut = threading.Event()
    pool = _Pool(start=cut)
    local: list[tuple[str, int | None]] = []

    def local_piece(piece: Piece, loader: Callable[[str], Any] | None = None) -> Any:
        cut.set()  # the worker starts now, and takes a piece before this one is done
        assert pool.ran_piece.wait(30)
        local.append((piece.task.rel, piece.start))
        return run_piece(piece, loader)

    def local_shard(task: ShardTask, loader: Callable[[str], Any] | None = None) -> Any:
        local.append((task.rel, None if len(task.computed) < len(task.keys) else -1))
        return run_shard(task, loader)

    def local_unit(unit: ShardTask | Piece) -> Any:
        return local_piece(unit) if isinstance(unit, Piece) else local_shard(unit)

    monkeypatch.setattr(schedule, "run_unit", local_unit)  # what this process runs
    monkeypatch.setattr(schedule, "run_shard", local_shard)  # the cut shards it writes
    results = schedule._collect(pool.submit, tasks, schedule._NoBar(), pool_size=1,
                                local=True, broken=lambda exc, left: exc, cut=True)
    rel = [t.rel for t in tasks]
    assert pool.ran[0] == (rel[0], None)  # its first shard is never taken back
    assert [r for r in local if r[1] is None] == [(rel[k], None) for k in (7, 6, 5, 4)]
    pieces = sorted(r for r in local + pool.ran if r[1] not in (None, -1))
    assert pieces == sorted((rel[k], a) for k in (1, 2, 3) for a in range(0, ROWS, ROWS // 8))
    assert any(r[1] not in (None, -1) for r in pool.ran[1:]), pool.ran
    assert any(r[1] not in (None, -1) for r in local), local
    assert sorted(r for r in local if r[1] == -1) == [(rel[k], -1) for k in (1, 2, 3)]
    assert sorted(results) == sorted(rel)
    for name, result in results.items():
        _same(result, reference[name])


def _record(key: str) -> dict[str, Any]:
    i = int(Path(key).name.split("-")[1])
    if i == 2_990:
        raise ValueError("a bad source in the last shard")
    return {"v": np.full((4,), i, np.float32), "ids": np.arange(i % 7, dtype=np.int32),
            "title": f"t{i}"}


@pytest.mark.parametrize("workers", [2, 3])
def test_a_build_by_several_processes_equals_the_build_by_one(
    tmp_path: Path, workers: int
) -> None:
    """Records with ragged and text fields, a failure near the end, real worker
    processes: the same rows, values and skipped keys as a build by one process."""
    keys = [f"k-{i}" for i in range(3_000)]
    fields: dict[str, tsc.Fixed | tsc.Ragged | tsc.Text] = {
        "v": tsc.Fixed((4,), "float32"), "ids": tsc.Ragged("int32", shape=(None,)),
        "title": tsc.Text()}
    built = {
        w: tsc.build_store(keys, tmp_path / f"w{w}.tsc", loader=_record, fields=fields,
                           workers=w, on_error="skip", progress=False, identity="none")
        for w in (1, workers)
    }
    one, many = built[1], built[workers]
    assert [k for k, _ in many.spec.skipped] == ["k-2990"] == [k for k, _ in one.spec.skipped]
    assert len(many) == len(one) == 2_999
    for key in keys:
        if key == "k-2990":
            continue
        a, b = one[key], many[key]
        assert np.array_equal(a["v"], b["v"]) and np.array_equal(a["ids"], b["ids"])
        assert a["title"] == b["title"] == f"t{key[2:]}"
    assert tsc.verify_store(many).ok


class _OneBuffer:
    """A loader that refills one buffer per process and returns it at every call (fixed and
    ragged fields alike): each row must be copied when it is kept."""

    def __init__(self) -> None:
        self.v = np.zeros(4, np.float32)
        self.ids = np.zeros(7, np.int32)

    def __call__(self, key: str) -> dict[str, Any]:
        i = int(key[2:])
        self.v[:] = i
        self.ids[:] = i
        return {"v": self.v, "ids": self.ids[: i % 7]}


_BUFFER = np.zeros(4, np.float32)


def _tensor_buffer(key: str) -> np.ndarray:
    _BUFFER[:] = int(key[2:])
    return _BUFFER


@pytest.mark.parametrize("workers", [1, 2])
def test_a_loader_that_refills_one_buffer_builds_every_row(tmp_path: Path, workers: int) -> None:
    """Every row of a build by one or two processes, pieces included, is its own key's."""
    keys = [f"k-{i}" for i in range(3_000)]
    fields: dict[str, tsc.Fixed | tsc.Ragged | tsc.Text] = {
        "v": tsc.Fixed((4,), "float32"), "ids": tsc.Ragged("int32", shape=(None,))}
    records = tsc.build_store(keys, tmp_path / "r.tsc", loader=_OneBuffer(), fields=fields,
                              workers=workers, progress=False, identity="none")
    tensors = tsc.build_store(keys, tmp_path / "t.tsc", loader=_tensor_buffer,
                              workers=workers, progress=False, identity="none")
    got = records.take(np.arange(len(keys)))
    want = np.arange(len(keys))
    assert np.array_equal(records.rows(keys), want) and np.array_equal(tensors.rows(keys), want)
    assert np.array_equal(got["v"][:, 0], want) and np.array_equal(tensors.take(want)[:, 3], want)
    assert np.array_equal(got["ids"].lengths, want % 7)
    assert all(np.array_equal(records[k]["ids"], np.full(i % 7, i)) for i, k in enumerate(keys))
