"""Batch loaders: batches computed in device workers (``devices=["cpu"]`` runs the whole path).

Real processes throughout: the CPU workers, the device workers and, for the
model, four racing processes. The loaders of :mod:`._batch_loaders` log every
setup, batch and prepare with the pid, so the tests count where and how often
each ran.
"""

from __future__ import annotations

import gzip
import multiprocessing
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.writer.device.environment import MALLOC_VARIABLES, keep_freed_memory

from ..conftest import write_images
from ..support._batch_loaders import (
    AfterCpuWorker,
    Embed,
    FailingSetup,
    Leaves,
    LoggedCoverEmbed,
    Prepare,
    Records,
    ShortBatches,
    events,
    value_of,
)

JOIN_S = 180  # a guard against hangs, not a timing assertion


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    out = tmp_path / "log"
    out.mkdir()
    monkeypatch.setenv("TSC_TEST_MODEL_LOG", str(out))
    monkeypatch.setenv("TSC_CACHE_DIR", str(tmp_path / "cache"))
    return str(out)


def _keys(n: int) -> list[str]:
    return [f"k{i}" for i in range(n)]


def test_setup_once_per_device_worker_never_here_and_prepare_in_the_cpu_workers(
    tmp_path: Path, where: str
) -> None:
    keys = _keys(400)
    store = tsc.build_store(keys, tmp_path / "s.tsc", loader=Embed(
                                where, prepare=Prepare(where, slow_in=os.getpid()), batch_size=16,
                                devices=["dev0", "dev1", "dev0"]),
                            loader_id="t/1", identity="none", workers=2, progress=False)
    # order kept, each key computed from its prepared item
    np.testing.assert_array_equal(store.stack(keys), np.stack([value_of(k + "!") for k in keys]))
    setups = events(where, "setup")
    assert sorted(device for _pid, device, _attr in setups) == ["dev0", "dev1"]
    assert all(device == attr for _pid, device, attr in setups)  # self.device set before setup
    device_pids = {int(pid) for pid, _d, _a in setups}
    assert len(device_pids) == 2 and os.getpid() not in device_pids
    # the model's module: imported in the device workers only, never here
    assert "tests.support._batch_model" not in sys.modules
    assert {int(pid) for pid, in events(where, "import")} == device_pids
    batches = events(where, "batch")
    assert {int(pid) for pid, _n, _first in batches} == device_pids
    assert sum(int(n) for _pid, n, _first in batches) == len(keys)  # each key once
    assert max(int(n) for _pid, n, _first in batches) == 16
    prepared = Counter(key for _pid, key in events(where, "prepare"))
    assert prepared == Counter(keys)
    prepare_pids = {int(pid) for pid, _key in events(where, "prepare")}
    assert not prepare_pids & device_pids
    assert prepare_pids - {os.getpid()}  # the CPU pool prepared some


def test_a_failing_batch_is_retried_key_by_key(tmp_path: Path, where: str) -> None:
    keys = _keys(40)
    keys[3], keys[17] = "bad3", "bad17"
    with pytest.raises(tsc.BuildError) as err:
        tsc.build_store(keys, tmp_path / "s.tsc", loader=Embed(where, batch_size=8),
                        loader_id="t/1", identity="none", workers=1, progress=False)
    assert [k for k, _r in err.value.failures] == ["bad3", "bad17"]
    assert all("ValueError: a bad item among 1" in r for _k, r in err.value.failures)
    store = tsc.build_store([*keys, "unprepared"], tmp_path / "t.tsc",
                            loader=Embed(where, batch_size=8, prepare=Prepare(where)),
                            loader_id="t/1", identity="none", workers=1, on_error="skip",
                            progress=False)
    assert [k for k, _r in store.spec.skipped] == ["bad3", "bad17", "unprepared"]
    assert "OSError: cannot prepare unprepared" in store.spec.skipped[2][1]
    good = [k for k in keys if "bad" not in k]
    np.testing.assert_array_equal(store.stack(good), np.stack([value_of(k + "!") for k in good]))


def test_wrong_number_of_rows_names_the_batch_first_key(tmp_path: Path, where: str) -> None:
    with pytest.raises(tsc.BuildError, match=r"leading dimension 3 .* batch of 4 items from 'k4'"):
        tsc.build_store(_keys(12), tmp_path / "s.tsc", loader=ShortBatches(where, batch_size=4),
                        loader_id="t/1", identity="none", workers=1, progress=False)
    assert not (tmp_path / "s.tsc").exists()


def test_setup_failure_is_a_build_error(tmp_path: Path) -> None:
    with pytest.raises(tsc.BuildError, match=r"setup\('cpu'\) failed .*no such device cpu"):
        tsc.build_store(_keys(4), tmp_path / "s.tsc", loader=FailingSetup(), loader_id="t/1",
                        identity="none", workers=1, progress=False)


@pytest.mark.parametrize("as_ragged", [False, True])
def test_records_with_a_ragged_field(tmp_path: Path, where: str, as_ragged: bool) -> None:
    keys = _keys(30)
    fields: dict[str, tsc.Fixed | tsc.Ragged] = {"vec": tsc.Fixed((4,), "float32"),
                                                  "ids": tsc.Ragged("int32")}
    store = tsc.cached(keys, loader=Records(where, as_ragged, batch_size=7),
                       loader_id="t.rec/1", identity="none", fields=fields, workers=1,
                       progress=False)
    for key in keys:
        record = store[key]
        np.testing.assert_array_equal(record["vec"], value_of(key))
        np.testing.assert_array_equal(record["ids"], np.arange(len(key) % 5 + 1))
    assert sum(int(n) for _pid, n, _first in events(where, "batch")) == len(keys)


def test_the_schema_comes_from_the_first_batch_computed_once(tmp_path: Path, where: str) -> None:
    keys = _keys(20)  # k0..k9 get 3 ids, k10..k19 get 4
    with pytest.raises(tsc.BuildError) as err:  # inferred from k0's record: both fields fixed
        tsc.cached(keys, loader=Records(where, batch_size=8), loader_id="t.rec/2",
                   identity="none", fields=("vec", "ids"), workers=1, progress=False)
    assert [k for k, _r in err.value.failures] == keys[10:]
    assert "field 'ids' must have shape (3,)" in err.value.failures[0][1]
    store = tsc.cached(keys, loader=Embed(where, batch_size=8), loader_id="t.vec/1",
                       identity="none", workers=1, progress=False)
    assert store.spec.item_shape == (4,)
    # the first batch, which gave the shape, was stored as computed: no key twice
    assert sum(int(n) for _pid, n, _first in events(where, "batch")) == 2 * len(keys)


def test_batch_options_belong_to_batch_loaders(tmp_path: Path, where: str) -> None:
    out = tmp_path / "s.tsc"
    with pytest.raises(TypeError, match="batch_size"):
        tsc.build_store(["a"], out, loader=value_of, batch_size=4)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="prepare"):
        tsc.cached(["a"], prepare=str, devices=["cpu"])  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="executor="):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            tsc.cached(["a"], loader=Embed(where), loader_id="t/1", executor=pool)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        tsc.cached(["a"], loader=Embed(where, batch_size=0), loader_id="t/1")
    with pytest.raises(ValueError, match="devices must name at least one device"):
        tsc.cached(["a"], loader=Embed(where, devices=[]), loader_id="t/1")
    assert not out.exists() and events(where, "setup") == []


def _racer(cache: str, paths: list[str], where: str, barrier: Any, out: str) -> None:
    from benchmarks.embed.embed_model import decode

    barrier.wait()
    store = tsc.cached(paths, cache_dir=cache, loader=LoggedCoverEmbed(where, prepare=decode, batch_size=16),
                       workers=1, progress=False)
    np.save(out, store.stack(paths))


def test_a_real_model_raced_by_four_processes(tmp_path: Path, where: str) -> None:
    pytest.importorskip("torch")  # the model's
    paths = write_images(tmp_path / "covers", 48)
    ctx: Any = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_racer, args=(str(tmp_path / "cache"), paths, where, barrier,
                                               str(tmp_path / f"out{i}.npy")))
             for i in range(4)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(JOIN_S)
            assert p.exitcode == 0, f"racer exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    outs = [np.load(tmp_path / f"out{i}.npy") for i in range(4)]
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])  # every process reads the same vectors
    assert outs[0].shape == (48, 128) and outs[0].dtype == np.float32
    assert len(events(where, "setup")) == 1  # one build, one device worker
    assert sum(int(n) for _pid, n, _first in events(where, "batch")) == len(paths)
    from benchmarks.embed.embed_model import embed

    np.testing.assert_allclose(outs[0], embed(paths), rtol=1e-4, atol=1e-5)


def test_an_incremental_add_computes_only_the_new_keys(tmp_path: Path, where: str) -> None:
    keys = _keys(50)
    tsc.cached(keys[:20], loader=Embed(where, batch_size=8), loader_id="t.inc/1",
               identity="none", workers=1, progress=False)
    store = tsc.cached(keys, loader=Embed(where, batch_size=8), loader_id="t.inc/1",
                       identity="none", workers=1, progress=False)
    np.testing.assert_array_equal(store.stack(keys), np.stack([value_of(k) for k in keys]))
    firsts = [first for _pid, _n, first in events(where, "batch")]
    assert sum(int(n) for _pid, n, _first in events(where, "batch")) == len(keys)
    assert "k20" in firsts  # the second build's first batch starts at the first new key
    assert len(events(where, "setup")) == 2  # a device worker per build


def test_cpu_workers_wait_for_a_slow_device_worker_when_nothing_is_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ..support._slow_start import SlowStart

    monkeypatch.setenv("TSC_TEST_SLOW_IMPORT", "3")  # the device worker's import, not ours
    keys = _keys(300)
    store = tsc.build_store(keys, tmp_path / "s.tsc", loader=SlowStart(batch_size=8),
                            loader_id="slow/1", identity="none", workers=2, progress=False)
    np.testing.assert_array_equal(store.stack(keys)[:, 0], np.arange(300, dtype=np.float32))


def test_a_result_that_cannot_be_sent_back_is_an_error_not_a_hang(tmp_path: Path) -> None:
    code = (
        "import tensorstore_cache as tsc\n"
        "from tests.support._slow_start import Unsendable\n"
        "try:\n"
        f"    tsc.build_store(['k1', 'k2', 'k3'], {str(tmp_path / 's.tsc')!r}, loader=Unsendable("
        "batch_size=2), loader_id='u/1', identity='none', workers=1, progress=False)\n"
        "except tsc.BuildError as err:\n"
        "    print(err)\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                          text=True, timeout=JOIN_S)
    assert proc.returncode == 0, proc.stderr
    assert "cannot be sent back" in proc.stdout and "k1" in proc.stdout and "k3" in proc.stdout


def test_results_without_one_row_per_item_name_the_batch() -> None:
    from tensorstore_cache.writer.device.results import batch_rows

    ragged = [np.zeros(2, np.float32), np.zeros(3, np.float32)]
    with pytest.raises(tsc.BuildError, match=r"rows of different shapes.*'k0'"):
        batch_rows(ragged, 2, "k0", None)
    with pytest.raises(tsc.BuildError, match=r"leading dimension 3.*'k0'"):
        batch_rows(np.zeros((3, 4)), 2, "k0", None)
    second = batch_rows({"ids": ragged}, 2, "k0", None)[1]
    assert [r.tolist() for r in second.values()] == [[0, 0, 0]]


class _Double(tsc.BatchLoader):
    def __call__(self, items: list[Any]) -> Any:
        return 2 * np.asarray(items)


def test_a_client_that_stalls_in_the_handshake_holds_up_no_other(tmp_path: Path) -> None:
    # the device worker authenticated connections inside accept(): one process
    # that connected and then stopped (SIGSTOP, a debugger) kept every CPU
    # worker of the build waiting for good
    import socket
    import threading
    from multiprocessing.connection import Client

    from tensorstore_cache.writer.device.server import serve

    address, key = str(tmp_path / "device.sock"), os.urandom(32)
    worker = threading.Thread(target=serve, args=(_Double(), "cpu", address, key), daemon=True)
    worker.start()
    stalled = socket.socket(socket.AF_UNIX)
    for _ in range(500):
        try:
            stalled.connect(address)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            threading.Event().wait(0.01)
    else:
        pytest.fail("the device worker never listened")
    with pytest.raises(multiprocessing.AuthenticationError):  # refused, and blocks no other
        Client(address, family="AF_UNIX", authkey=b"not the build's key")
    conn = Client(address, family="AF_UNIX", authkey=key)  # hung here before
    conn.send([1.0, 2.0])
    status, value, _ = conn.recv()
    assert status == "ok" and value.tolist() == [2.0, 4.0]
    conn.send(None)
    worker.join(JOIN_S)
    assert not worker.is_alive()
    stalled.close()
    conn.close()


def test_a_device_worker_ends_with_its_atexit_handlers_run_and_its_files_flushed(
    tmp_path: Path, where: str
) -> None:
    # a device worker skips the interpreter's teardown once it has served its build:
    # what the loader wrote to a file it never closed, and its atexit handlers, still count
    keys = _keys(100)
    store = tsc.build_store(keys, tmp_path / "s.tsc", loader=Leaves(where, batch_size=16),
                            loader_id="t/1", identity="none", workers=1, progress=False)
    np.testing.assert_array_equal(store.stack(keys), np.stack([value_of(k) for k in keys]))
    (pid, _device, _attr), = events(where, "setup")
    lines = (Path(where) / "kept.txt").read_text().splitlines()
    assert lines[0] == f"setup {pid}"
    assert sum(int(line.split()[1]) for line in lines[1:]) == len(keys)
    # the gzip file closed before the file under it: a whole gzip stream
    zipped = gzip.decompress((Path(where) / "kept.gz").read_bytes()).decode().splitlines()
    assert zipped == lines[1:]
    assert events(where, "atexit") == [[pid]]
    assert events(where, "collected") == []  # the teardown, which collects it, was skipped
    with pytest.raises(ProcessLookupError):  # exited and reaped before the build returned
        os.kill(int(pid), 0)


def test_device_workers_wait_passively_and_keep_memory_unless_told_otherwise(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OMP_WAIT_POLICY", "GLIBC_TUNABLES", "LD_PRELOAD", *MALLOC_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    tsc.build_store(_keys(10), tmp_path / "s.tsc", loader=Leaves(where, batch_size=4),
                    loader_id="t/1", identity="none", workers=1, progress=False)
    # the user's settings win: glibc's trim threshold alone leaves every large block mapped
    # and unmapped again
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    tsc.build_store(_keys(10), tmp_path / "t.tsc", loader=Leaves(where, batch_size=4),
                    loader_id="t/1", identity="none", workers=1, progress=False)
    assert events(where, "omp") == [["PASSIVE"], ["ACTIVE"]]
    if not _glibc():
        return
    # a large block freed is kept for the next batch, not unmapped and faulted in again
    # (8 allocations: at least 8 faults when it is unmapped every time)
    (kept,), (left_alone,) = events(where, "faults")
    assert int(kept) < 8 <= int(left_alone), (kept, left_alone)


def _glibc() -> bool:
    try:
        return str(os.confstr("CS_GNU_LIBC_VERSION")).startswith("glibc ")
    except (ValueError, OSError):
        return False


def test_the_allocator_is_left_alone_when_the_user_set_it_up() -> None:
    for env in ({"MALLOC_TOP_PAD_": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
                {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, {"MALLOC_MMAP_THRESHOLD_": "1"}):
        assert keep_freed_memory(env) == 0, env
    # set up in a process of its own (it would change this one's allocator)
    code = ("from tensorstore_cache.writer.device import keep_freed_memory as k; "
            "print(k({}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    if _glibc():  # 32 MiB where glibc (before 2.35) refuses more
        assert int(out) in (1 << 30, 32 << 20)
    else:
        assert int(out) == 0


def test_cpu_workers_start_beside_the_device_workers_only_for_several_shards(
    tmp_path: Path, where: str
) -> None:
    main = os.getpid()
    # one shard (64 rows at least); three (the batches queued behind the first belong to
    # shards the pool takes first: taken before); ten (taken once the pool has its first)
    for name, n in (("one", 60), ("few", 150), ("many", 600)):
        keys = [f"{name}{i}" for i in range(n)]
        batching: dict[str, Any] = {"prepare": Prepare(where, slow_in=main), "batch_size": 8}
        loader = AfterCpuWorker(where, len(events(where, "started")), **batching) \
            if name == "many" else Embed(where, **batching)
        store = tsc.build_store(keys, tmp_path / f"{name}.tsc", loader=loader,
                                loader_id="t/1", identity="none", workers=2, progress=False)
        np.testing.assert_array_equal(store.stack(keys),
                                      np.stack([value_of(k + "!") for k in keys]))
        pids = {int(pid) for pid, key in events(where, "prepare") if key.startswith(name)}
        assert (pids == {main}) if name == "one" else (pids - {main} != set())
        if name == "many":  # its CPU worker started before the first batch was computed
            # (its device worker waits for that; it gives up only if none had started)
            assert events(where, "gave-up") == [], "no CPU worker started before the first batch"
            log = (Path(where) / "log").read_text().splitlines()
            build = log[next(i for i, line in enumerate(log) if line.startswith("prepare ")
                             and line.split()[2].startswith(name)):]
            assert build.index(next(x for x in build if x.startswith("started "))) \
                < build.index(next(x for x in build if x.startswith("batch ")))
        # every key prepared once and given to the model once, the batches queued behind
        # the first one (while the shape was learned) included
        assert Counter(k for _p, k in events(where, "prepare") if k.startswith(name)) \
            == Counter(keys)
    assert sum(int(n) for _pid, n, _first in events(where, "batch")) == 810
