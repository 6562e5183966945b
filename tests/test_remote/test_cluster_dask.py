"""A Dask build through ``remote=``: the node holding the cluster's lease runs the shard tasks
on the executor, each task uploading its shard straight into the remote part from the worker
that ran it (no worker needs a node's cache directory), and every key is computed once in the
cluster.

The Dask cluster is a real ``LocalCluster`` of two worker processes, shared by the nodes (each
node process connects its own client to the scheduler, as jobs connect to a cluster's); the
nodes are agent processes with separate cache directories (``tests.support._cluster``), at
once, against the S3 test server or a shared directory. The loader logs ``<pid> <key>`` with
``O_APPEND`` from whichever process computes it, so "once" is counted, and by whom. Workers
are SIGKILLed mid-task on a cluster that retries and on one that allows no retry (a cluster of
its own), and the test server refuses the workers' uploads, to show what reaches the remote
then. Skipped without ``dask[distributed]``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.common.s3server import Fault, S3Process
from tensorstore_cache.writer.tasks import ShardTask
from tests.support._cluster import Agent, LoggedVector, computed_by, launch, spec_env
from tests.support._workers import die_once

from .test_dask import _dead

pytest.importorskip("s3fs")

BUCKET = "dask-cluster"
N_SOURCES = 160  # three shard tasks (64, 64 and 32 rows) with workers=2
#: The data files of a part (shards of its vectors, or of a fixed field of records).
_SHARD = re.compile(r"/(vectors|fields/vec)/c/")
GUARD_S = 120  # a hang guard, never a timing assertion


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    import dask

    # a task may be running on a worker that dies this many times before it is declared bad
    with dask.config.set({"distributed.scheduler.allowed-failures": 3}):
        cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                           dashboard_address=":0")
    with cluster, distributed.Client(cluster) as c:
        yield c


@pytest.fixture
def sources(tmp_path: Path) -> list[str]:
    """Source files, by absolute path (every node and worker sees them there)."""
    root = tmp_path / "sources"
    root.mkdir()
    paths = []
    for i in range(N_SOURCES):
        path = root / f"s{i:03d}.bin"
        path.write_bytes(bytes([i]) * 100)
        paths.append(str(path))
    return paths


def _wait(path: Path, agent: Agent) -> None:
    deadline = time.monotonic() + GUARD_S
    while not path.exists():
        assert agent.proc.poll() is None and time.monotonic() < deadline, agent.result()
        time.sleep(0.02)


def _ok(verdict: dict[str, Any]) -> None:
    assert verdict["ok"], verdict.get("traceback") or verdict
    assert verdict["wrong"] == 0


def _shards_in(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file() and _SHARD.search(p.as_posix())]


@pytest.mark.parametrize("where", ["s3", "directory"])
def test_a_dask_build_once_per_cluster(
    client: Any, s3: S3Process, sources: list[str], tmp_path: Path, where: str
) -> None:
    """3 nodes at once, each building on the Dask cluster: every key computed once, by the
    Dask workers; the shards were uploaded by the tasks (no node's cache directory holds one
    before anything is read), every node gets the right vectors (records on the shared
    directory), and the sources' content hashes were recorded: a fourth node whose sources
    have new mtimes computes nothing."""
    s3.inject([])
    if where == "s3":
        remote, options = f"s3://{BUCKET}/once", s3.storage_options()
    else:
        (tmp_path / "shared").mkdir()
        remote, options = str(tmp_path / "shared"), None
    log, start, go = tmp_path / "log", tmp_path / "start", tmp_path / "go"
    spec: dict[str, Any] = {"storage_options": options, "loader": "logged", "workers": 2,
                            "identity": "stat", "records": where == "directory", "go": str(go)}
    agents = [launch(tmp_path, f"n{n}", sources, remote, spec_env(log, ttl=3.0), start=start,
                     dask=client.scheduler.address, returned=str(tmp_path / f"n{n}.returned"),
                     **spec) for n in range(3)]
    for agent in agents:
        agent.wait_ready()
    start.touch()
    for n, agent in enumerate(agents):
        _wait(tmp_path / f"n{n}.returned", agent)
    # built and committed, nothing read yet: the shards are at the remote only
    assert [p for n in range(3) for p in _shards_in(tmp_path / f"n{n}")] == []
    go.touch()
    for agent in agents:
        _ok(agent.result())
    by = computed_by(log)
    assert sorted(key for _pid, key in by) == sorted(sources)  # each key once
    workers = set(client.run(os.getpid).values())
    assert {int(pid) for pid, _key in by} <= workers  # all of them on the Dask workers
    if where == "s3":  # one build in the cluster: each shard uploaded once, into one part
        [manifest] = [rel for rel in _remote_objects(s3, remote) if "/manifests/" in rel]
        [part] = _read(s3, remote, manifest)["parts"]
        root = f"{BUCKET}/once/{manifest.split('/')[0]}/parts/{part['id']}/"
        shards = [r.key.removeprefix(root) for r in s3.requests("PUT", under=f"{BUCKET}/once/")
                  if "/vectors/c/" in r.key]
        assert sorted(shards) == _shard_files(s3, root)

    later = time.time() + 100
    for path in sources:  # copies: the same bytes, new mtimes
        os.utime(path, (later, later))
    fourth = launch(tmp_path, "n3", sources, remote, spec_env(log, ttl=3.0), **spec)
    verdict = fourth.result()
    _ok(verdict)
    assert verdict["content_reads"] == len(sources)  # compared by content hash, ...
    assert computed_by(log) == by  # ... and nothing computed


class KillOnce(LoggedVector):
    """:class:`LoggedVector`, except that the first process to load ``victim`` SIGKILLs
    itself (the marker, created with ``O_EXCL``, makes it happen once)."""

    def __init__(self, log: str, victim: str, marker: str) -> None:
        super().__init__(log)
        self.victim = victim
        self.marker = marker

    def __call__(self, key: str) -> Any:
        if key == self.victim:
            die_once(self.marker)
        return super().__call__(key)


class FailSome(LoggedVector):
    """:class:`LoggedVector`, failing on the keys of ``bad``."""

    bad: ClassVar[frozenset[str]] = frozenset({"item/003", "item/017"})

    def __call__(self, key: str) -> Any:
        if key in self.bad:
            raise OSError(f"cannot read {key}")
        return super().__call__(key)


KEYS = [f"item/{i:03d}" for i in range(N_SOURCES)]


def _node(client: Any, s3: S3Process, cache: Path, prefix: str, loader: Any,
          **kw: Any) -> tsc.CacheStore:
    """A node in this process: ``cached()`` through the remote, building on the Dask cluster."""
    return tsc.cached(KEYS, cache_dir=cache, remote=prefix, storage_options=s3.storage_options(),
                      loader=loader, loader_id="dask.logged/1", identity="none", workers=2,
                      progress=False, executor=client.get_executor(), **kw)


@pytest.fixture
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node in this process polls a lease as the agents do (every 0.3 to 1 s)."""
    monkeypatch.setenv("TSC_REMOTE_LEASE_TTL", "3")


def _remote_objects(s3: S3Process, prefix: str) -> list[str]:
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.storage_options())
    root = prefix.removeprefix("s3://")
    return sorted(str(p).removeprefix(root + "/") for p in fs.find(root))


def _read(s3: S3Process, prefix: str, rel: str) -> Any:
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.storage_options())
    return json.loads(fs.cat_file(f"{prefix.removeprefix('s3://')}/{rel}"))


def _shard_files(s3: S3Process, root: str) -> list[str]:
    """The shard files the group ``zarr.json`` of the store at ``root`` lists."""
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.storage_options())
    files = json.loads(fs.cat_file(f"{root}zarr.json"))["attributes"]["tensorstore_cache"]["files"]
    return sorted(rel for rel in files if _SHARD.search("/" + rel))


def _want(keys: list[str]) -> np.ndarray:
    from tests.support._cluster import _value

    return np.stack([_value(k) for k in keys])


def test_a_worker_killed_mid_task_is_retried(
    client: Any, s3: S3Process, tmp_path: Path, short_lease: None
) -> None:
    """A Dask worker killed while it computes a shard task: the scheduler runs the task again
    on another worker, the retry uploads the shard again, and the part is committed whole;
    only the killed task's keys are computed twice, and another node computes nothing."""
    s3.inject([])
    prefix, log, marker = f"s3://{BUCKET}/killed", tmp_path / "log", tmp_path / "killed.pid"
    before = set(client.run(os.getpid).values())
    store = _node(client, s3, tmp_path / "n0", prefix, KillOnce(str(log), KEYS[5], str(marker)))
    np.testing.assert_array_equal(store.take(store.rows(KEYS)), _want(KEYS))
    victim = int(marker.read_text())
    # a worker process really died, and the build went on without it (whether and when the
    # cluster replaces it is distributed's)
    assert victim in before and _dead(victim)
    keys = [key for _pid, key in computed_by(log)]
    assert sorted(set(keys)) == KEYS and max(keys.count(k) for k in KEYS) <= 2
    rows = store.spec.rows_per_shard
    first = 5 // rows * rows  # the killed task's keys, and only they, were computed twice
    assert {k for k in KEYS if keys.count(k) == 2} <= set(KEYS[first : first + rows]) and rows < len(KEYS)
    other = _node(client, s3, tmp_path / "n1", prefix, LoggedVector(str(tmp_path / "log1")))
    np.testing.assert_array_equal(other.take(other.rows(KEYS)), _want(KEYS))
    assert not (tmp_path / "log1").exists()  # nothing computed there


def test_a_failing_task_commits_nothing(
    client: Any, s3: S3Process, tmp_path: Path, short_lease: None
) -> None:
    """A source failing on a Dask worker: with ``on_error="raise"``, a ``BuildError`` naming
    it, no manifest, none of the uploaded shards left, the lease released; with
    ``on_error="skip"``, the rest is committed and the manifest lists the skipped keys."""
    s3.inject([])
    prefix, log = f"s3://{BUCKET}/failing", str(tmp_path / "log")
    with pytest.raises(tsc.BuildError) as info:
        _node(client, s3, tmp_path / "n0", prefix, FailSome(log))
    assert sorted(p for p, _r in info.value.failures) == sorted(FailSome.bad)
    left = _remote_objects(s3, prefix)
    [ns] = {rel.split("/", 1)[0] for rel in left if "/leases/" in rel}
    assert [rel for rel in left if "/parts/" in rel or "/manifests/" in rel] == []
    assert _read(s3, prefix, f"{ns}/leases/g00000000.a0000.json")["state"] == "released"

    store = _node(client, s3, tmp_path / "n0", prefix, FailSome(log), on_error="skip")
    good = [k for k in KEYS if k not in FailSome.bad]
    assert sorted(store.paths) == good
    np.testing.assert_array_equal(store.take(store.rows(good)), _want(good))
    manifest = _read(s3, prefix, f"{ns}/manifests/00000001.json")
    assert sorted(manifest["skipped"]) == sorted(FailSome.bad) and len(manifest["parts"]) == 1


def test_ctrl_c_on_the_holder_hands_the_lease_over(
    client: Any, s3: S3Process, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT) on the node whose shard tasks run on the Dask cluster: it stops with
    ``KeyboardInterrupt``, its lease released and nothing of its part committed; a node
    waiting for it takes over, every key is computed at most twice, and every node gets the
    right vectors."""
    s3.inject([])
    prefix, log, gate = f"s3://{BUCKET}/interrupted", tmp_path / "log", tmp_path / "gate"
    spec: dict[str, Any] = {"storage_options": s3.storage_options(), "loader": "logged",
                            "workers": 2, "gate": str(gate), "dask": client.scheduler.address}
    env, start = spec_env(log, ttl=3.0), tmp_path / "start"
    holder = launch(tmp_path, "n0", KEYS, prefix, env, **spec)
    waiters = [launch(tmp_path, f"n{n}", KEYS, prefix, env, start=start, **spec) for n in (1, 2)]
    deadline = time.monotonic() + GUARD_S
    while not log.exists():  # n0 holds the lease: its first tasks run, held at the gate
        assert holder.proc.poll() is None and time.monotonic() < deadline, holder.result()
        time.sleep(0.02)
    for agent in waiters:
        agent.wait_ready()
    start.touch()
    holder.proc.send_signal(signal.SIGINT)
    interrupted = holder.result()
    assert interrupted["error"] == "KeyboardInterrupt", interrupted
    gate.touch()
    for agent in waiters:
        _ok(agent.result())
    keys = [key for _pid, key in computed_by(log)]
    assert sorted(set(keys)) == KEYS and max(keys.count(k) for k in KEYS) <= 2
    left = _remote_objects(s3, prefix)
    [ns] = {rel.split("/", 1)[0] for rel in left if "/leases/" in rel}
    assert _read(s3, prefix, f"{ns}/leases/g00000000.a0000.json")["state"] == "released"
    assert [rel for rel in left if "/manifests/" in rel] == [f"{ns}/manifests/00000001.json"]
    [part] = _read(s3, prefix, f"{ns}/manifests/00000001.json")["parts"]
    complete = {rel.split("/")[2].removesuffix(".bundle") for rel in left
                if rel.endswith((".bundle", "/zarr.json")) and "/parts/" in rel}
    assert complete == {part["id"]}  # the interrupted part: never a store, never a bundle


def _idle(client: Any) -> None:
    """Wait until no task runs or waits on the Dask cluster of ``client`` (a hang guard)."""
    deadline = time.monotonic() + GUARD_S
    while any(client.processing().values()):
        assert time.monotonic() < deadline, client.processing()
        time.sleep(0.05)


def test_a_worker_killed_without_retries_leaves_no_half_store(
    client: Any, s3: S3Process, tmp_path: Path, short_lease: None
) -> None:
    """A worker SIGKILLed mid-task on a Dask cluster that allows no retry: the holder's call
    fails with ``KilledWorker`` naming the shard and the remote, and the remote holds no half
    store: no manifest, no group ``zarr.json`` or bundle of the part, the lease released;
    once the cluster is idle, ``gc(remote=...)`` deletes every shard the build's tasks sent.
    Then a node builds on a cluster that retries, each shard uploaded once, a second node
    computes nothing, and a third reads every vector from the remote."""
    distributed = pytest.importorskip("distributed")
    import dask

    s3.inject([])
    prefix, marker = f"s3://{BUCKET}/killed-for-good", tmp_path / "killed.pid"
    log = tmp_path / "log"
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        strict = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                          dashboard_address=":0")
    with strict, distributed.Client(strict) as c:
        with pytest.raises(distributed.KilledWorker) as info:
            tsc.cached(KEYS, cache_dir=tmp_path / "n0", remote=prefix,
                       storage_options=s3.storage_options(), loader_id="dask.logged/1",
                       loader=KillOnce(str(log), KEYS[70], str(marker)), identity="none",
                       workers=2, progress=False, executor=c.get_executor())
        _idle(c)
    notes = "\n".join(info.value.__notes__)
    assert "while building shard vectors/c/" in notes, notes
    assert f"nothing was committed to '{prefix}/" in notes, notes
    assert marker.exists()
    left = _remote_objects(s3, prefix)
    [ns] = {rel.split("/", 1)[0] for rel in left if "/leases/" in rel}
    stores = [rel for rel in left if "/manifests/" in rel
              or ("/parts/" in rel and rel.endswith((".bundle", "zarr.json")))]
    assert stores == []  # no store, half or whole, and nothing names one
    assert _read(s3, prefix, f"{ns}/leases/g00000000.a0000.json")["state"] == "released"
    tsc.gc(remote=prefix, storage_options=s3.storage_options(), older_than=0)
    assert [rel for rel in _remote_objects(s3, prefix) if "/parts/" in rel] == []

    store = _node(client, s3, tmp_path / "n1", prefix, LoggedVector(str(log)))
    np.testing.assert_array_equal(store.take(store.rows(KEYS)), _want(KEYS))
    rows = store.spec.rows_per_shard  # the same plan as the killed build's
    assert f"({rows} sources from {KEYS[70 // rows * rows]!r})" in notes, notes
    [part] = _read(s3, prefix, f"{ns}/manifests/00000001.json")["parts"]
    root = f"{BUCKET}/killed-for-good/{ns}/parts/{part['id']}/"
    shards = [r.key.removeprefix(root) for r in s3.requests("PUT", under=root)
              if "/vectors/c/" in r.key]
    assert sorted(shards) == _shard_files(s3, root)
    assert len(shards) == -(-len(KEYS) // rows) > 1
    other = _node(client, s3, tmp_path / "n2", prefix, LoggedVector(str(tmp_path / "log2")))
    np.testing.assert_array_equal(other.take(other.rows(KEYS)), _want(KEYS))
    assert not (tmp_path / "log2").exists()  # nothing computed there


def test_workers_that_may_not_write_the_remote(
    client: Any, s3: S3Process, tmp_path: Path, short_lease: None
) -> None:
    """The bucket refuses the shards the Dask workers send (403, as to credentials that may
    only read): the holder's call fails with ``PermissionError`` naming the shard, the
    remote, the machine that sent it, what to give the workers, and that nothing was
    committed; the lease is released and no manifest written."""
    prefix = f"s3://{BUCKET}/denied"
    s3.inject([Fault("denied", match="/vectors/c/", method="PUT", count=-1)])
    try:
        with pytest.raises(PermissionError) as info:
            _node(client, s3, tmp_path / "n0", prefix, LoggedVector(str(tmp_path / "log")))
    finally:
        s3.inject([])
    notes = "\n".join(info.value.__notes__)
    assert "while building shard vectors/c/" in notes, notes
    assert "while uploading 'vectors/c/" in notes and f"of '{prefix}/" in notes, notes
    assert socket.gethostname() in notes and "needs write access there" in notes, notes
    assert f"nothing was committed to '{prefix}/" in notes, notes
    assert "testing" not in notes  # the storage options' secret key is never shown, ...
    logs = [msg for lines in client.get_worker_logs().values() for _level, msg in lines]
    assert any("Compute Failed" in msg for msg in logs)
    assert not [msg for msg in logs if "testing" in msg]  # ... nor logged by the workers ...
    task = ShardTask(root="", rel="vectors/c/0/0", keys=KEYS, loader=None, dtype="float32",
                     item_shape=(8,), rows_per_shard=64, write_on_failure=False,
                     upload=prefix, storage_options=s3.storage_options())
    assert "testing" not in repr(task)  # ... nor shown by the task they were sent
    left = _remote_objects(s3, prefix)
    [ns] = {rel.split("/", 1)[0] for rel in left if "/leases/" in rel}
    assert [rel for rel in left if "/manifests/" in rel] == []
    assert _read(s3, prefix, f"{ns}/leases/g00000000.a0000.json")["state"] == "released"
