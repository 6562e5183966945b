"""Building on a Dask cluster, and shard tasks that survive being killed and retried.

The Dask tests run a real ``LocalCluster`` of two worker processes; they are
skipped when ``dask[distributed]`` is not installed. The retry tests kill a
worker process with SIGKILL while it builds a shard.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.common.s3server import S3Process
from tensorstore_cache.format.keys import normalize_key
from tensorstore_cache.format.metadata import GroupMetadata
from tensorstore_cache.fs.durable import file_digest
from tensorstore_cache.fs.temp import parse_temp, remove_temps, temp_path
from tensorstore_cache.writer.tasks import ShardTask, run_shard

from ..conftest import write_images
from ..support import _records
from ..support._workers import die_once

N_IMAGES = 320  # five shards of 64 rows with workers=2


class KillOnce:
    """The image loader, except that the first process to see ``victim`` leaves
    the debris of a half-finished shard write behind and SIGKILLs itself.

    The marker file (created with O_EXCL) makes the kill happen exactly once, on
    whichever process gets there first; the retry then loads normally.
    """

    item_shape = (3, 32, 32)  # no probing in the coordinator (it must not be killed)
    params: ClassVar[dict[str, Any]] = {}

    def __init__(self, victim: str, marker: str, out: str) -> None:
        self.victim = normalize_key(victim)
        self.marker = marker
        self.out = out
        self.image = tsc.ImageLoader(size=(32, 32))

    def __call__(self, path: str) -> np.ndarray:
        if normalize_key(path) == self.victim:
            die_once(self.marker, before=self._leave_debris)
        return self.image(path)

    def _leave_debris(self) -> None:
        # What an attempt killed during its write would leave, and worse: a torn
        # file at the shard's own path (the retry must replace both safely).
        out = Path(self.out)
        for build in out.parent.glob(f".{out.name}.tsc-build-*"):
            shard = build / "vectors" / "c" / "0" / "0" / "0" / "0"
            shard.parent.mkdir(parents=True, exist_ok=True)
            temp_path(shard, "new").write_bytes(b"\x00" * 1000)
            shard.write_bytes(b"torn" * 100)


class FailSome:
    """The image loader, failing on the paths named in ``bad``."""

    item_shape = (3, 32, 32)
    params: ClassVar[dict[str, Any]] = {}

    def __init__(self, bad: set[str]) -> None:
        self.bad = bad
        self.image = tsc.ImageLoader(size=(32, 32))

    def __call__(self, path: str) -> np.ndarray:
        if os.path.basename(path) in self.bad:
            raise OSError(f"cannot read {path}")
        return self.image(path)


def _all_rows(store: tsc.CacheStore) -> np.ndarray:
    return np.asarray(store.take(np.arange(len(store))))


def _assert_intact(out: Path) -> None:
    """Every file listed in the metadata has its recorded size and checksum; no debris."""
    files = GroupMetadata.read(out).files
    for rel, (size, digest) in files.items():
        assert file_digest(out / rel) == (size, digest), rel
    leftovers = [p for p in out.rglob("*") if p.is_file() and parse_temp(p.name) is not None]
    assert leftovers == []
    assert not list(out.parent.glob(f".{out.name}.tsc-build-*"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    root = tmp_path_factory.mktemp("dask")
    images = write_images(root / "images", N_IMAGES, seed=11, gray_every=13)
    reference = tsc.build_store(images, root / "local.tsc", workers=1, progress=False)
    reference.close()
    return images, root / "local.tsc"


def _dead(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie (dead, not yet waited for)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _cluster(allowed_failures: int) -> Any:
    distributed = pytest.importorskip("distributed")
    import dask

    # The scheduler reads this when it starts: how many times a task may be
    # running on a worker that dies before the task is declared bad (KilledWorker).
    with dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures}):
        cluster = distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
        )
    return cluster


@pytest.fixture(scope="module")
def client() -> Any:
    distributed = pytest.importorskip("distributed")
    cluster = _cluster(allowed_failures=3)
    with cluster, distributed.Client(cluster) as c:
        yield c


def test_dask_build_equals_local_build(
    client: Any, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    images, local = sources
    out = tmp_path / "dask.tsc"
    store = tsc.build_store(
        images, out, workers=2, progress=False, executor=client.get_executor()
    )
    reference = tsc.open_store(local)
    assert store.spec.rows_per_shard < len(images)  # several shard tasks
    assert store.paths == reference.paths
    assert store.spec.loader_id == reference.spec.loader_id
    np.testing.assert_array_equal(_all_rows(store), _all_rows(reference))
    for p in images[::37]:
        np.testing.assert_array_equal(store[p], reference[p])
    _assert_intact(out)


def test_dask_build_to_an_s3_url_uploads_from_the_workers(
    client: Any, sources: tuple[list[str], Path], tmp_path: Path, s3: S3Process
) -> None:
    images, local = sources
    s3.create_bucket("cluster")
    store = tsc.build_store(
        images, "s3://cluster/dask.tsc", workers=2, progress=False,
        executor=client.get_executor(), cache_dir=tmp_path / "builder",
        storage_options=s3.storage_options(),
    )
    # no shard lies in the builder's copy: the Dask workers uploaded them
    assert not list(Path(store.location).glob("vectors/c/**/0"))
    puts = s3.requests("PUT", under="cluster/dask.tsc/")
    assert len([r for r in puts if "/vectors/c/" in r.key]) == -(-len(images) // store.spec.rows_per_shard)
    assert puts[-1].key == "cluster/dask.tsc/zarr.json"
    reference = tsc.open_store(local)
    np.testing.assert_array_equal(_all_rows(store), _all_rows(reference))
    store.verify()


def test_dask_build_reports_every_failure_and_publishes_nothing(
    client: Any, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    images, _ = sources
    out = tmp_path / "fail.tsc"
    bad = {"img_00010.jpg", "img_00011.jpg", "img_00200.jpg", "img_00319.jpg"}  # shards 0, 3, 4
    with pytest.raises(tsc.BuildError) as info:
        tsc.build_store(
            images, out, workers=2, progress=False, loader=FailSome(bad),
            executor=client.get_executor(),
        )
    failed = [Path(p).name for p, _ in info.value.failures]
    assert failed == sorted(bad)  # every failure, in input order
    assert all("OSError: cannot read" in r for _, r in info.value.failures)
    assert not out.exists()
    assert not list(tmp_path.glob(".fail.tsc.tsc-build-*"))
    skipped = tsc.build_store(
        images, out, workers=2, progress=False, loader=FailSome(bad),
        executor=client.get_executor(), on_error="skip",
    )
    assert len(skipped) == N_IMAGES - len(bad)
    assert [Path(p).name for p, _ in skipped.spec.skipped] == failed
    _assert_intact(out)


def test_cached_builds_its_parts_on_the_cluster(
    client: Any, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    cached = getattr(tsc, "cached", None)
    if cached is None:
        pytest.skip("this build has no tensorstore_cache.cached")
    images, local = sources
    reference = tsc.open_store(local)
    first = cached(
        images[:200], cache_dir=tmp_path / "cache", workers=2, progress=False,
        executor=client.get_executor(),
    )
    np.testing.assert_array_equal(first.take(first.rows(images[:200])), reference.take(np.arange(200)))
    # the rest is computed on the cluster too, into a second part
    both = cached(
        images, cache_dir=tmp_path / "cache", workers=2, progress=False,
        executor=client.get_executor(),
    )
    np.testing.assert_array_equal(both.take(both.rows(images)), _all_rows(reference))


def _same_records(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for name, value in want.items():
        if isinstance(value, tsc.Ragged):
            np.testing.assert_array_equal(got[name].values, value.values)
            np.testing.assert_array_equal(got[name].offsets, value.offsets)
        elif isinstance(value, list):
            assert got[name] == value
        else:
            np.testing.assert_array_equal(got[name], value)


@pytest.fixture(scope="module")
def record_sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    root = tmp_path_factory.mktemp("dask-records")
    paths = _records.write_sources(root / "src", 600)
    tsc.build_store(paths, root / "local.tsc", loader=_records.RecordLoader(boxes=True),
                    loader_id="rec/1", fields=_records.BOX_FIELDS, workers=1, progress=False,
                    shard_bytes=4096).close()
    return paths, root / "local.tsc"


def test_dask_build_of_records_equals_local_build(
    client: Any, record_sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    paths, local = record_sources
    out = tmp_path / "dask.tsc"
    log = tmp_path / "calls.log"
    store = tsc.build_store(
        paths, out, loader=_records.RecordLoader(log, boxes=True), loader_id="rec/1",
        fields=_records.BOX_FIELDS, workers=2, progress=False, shard_bytes=4096,
        executor=client.get_executor(),
    )
    workers = set(client.run(os.getpid).values())
    callers = {int(line.split()[0]) for line in log.read_text().splitlines()}
    assert callers <= workers and len(callers) == 2  # the cluster's processes loaded every record
    reference = tsc.open_store(local)
    assert store.paths == reference.paths
    assert -(-len(paths) // store.spec.rows_per_shard) > 2  # several shard tasks
    _same_records(store.take(np.arange(len(paths))), reference.take(np.arange(len(paths))))
    for p in paths[::41]:
        assert _records.same(store[p], _records.expected(p, boxes=True))
    store.verify()
    _assert_intact(out)
    assert not (out / "runs").exists()


def test_dask_build_of_records_to_an_s3_url_uploads_from_the_workers(
    client: Any, record_sources: tuple[list[str], Path], tmp_path: Path, s3: S3Process
) -> None:
    paths, local = record_sources
    s3.create_bucket("cluster-records")
    store = tsc.build_store(
        paths, "s3://cluster-records/r.tsc", loader=_records.RecordLoader(boxes=True),
        loader_id="rec/1", fields=_records.BOX_FIELDS, workers=2, progress=False,
        shard_bytes=4096, executor=client.get_executor(), cache_dir=tmp_path / "builder",
        storage_options=s3.storage_options(),
    )
    # no fixed shard lies in the builder's copy: the Dask workers uploaded them, and the runs
    assert not list(Path(store.location).glob("fields/image/c/**/0"))
    puts = s3.requests("PUT", under="cluster-records/r.tsc/")
    tasks = -(-len(paths) // store.spec.rows_per_shard)
    assert len([r for r in puts if "/fields/image/c/" in r.key]) == tasks
    assert len([r for r in puts if "/runs/title_ids/" in r.key]) == tasks
    assert puts[-1].key == "cluster-records/r.tsc/zarr.json"
    reference = tsc.open_store(local)
    with tsc.open_store("s3://cluster-records/r.tsc", cache_dir=tmp_path / "reader",
                        storage_options=s3.storage_options()) as other:
        _same_records(other.take(np.arange(len(paths))), reference.take(np.arange(len(paths))))
        other.verify()


def test_worker_killed_mid_build_is_retried(
    client: Any, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    images, local = sources
    out = tmp_path / "killed.tsc"
    marker = tmp_path / "killed.pid"
    pids_before = set(client.run(os.getpid).values())
    loader = KillOnce(images[5], str(marker), str(out))
    store = tsc.build_store(
        images, out, workers=2, progress=False, loader=loader, loader_id="image-kill-once",
        executor=client.get_executor(),
    )
    victim = int(marker.read_text())
    # a worker process really died, and the build went on without it (whether and when the
    # cluster replaces it is distributed's: a restarted worker may even be closed again)
    assert victim in pids_before and _dead(victim)
    reference = tsc.open_store(local)
    assert store.paths == reference.paths
    np.testing.assert_array_equal(_all_rows(store), _all_rows(reference))
    _assert_intact(out)


def test_worker_killed_without_retries_publishes_nothing(
    sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    distributed = pytest.importorskip("distributed")
    images, _ = sources
    out = tmp_path / "killed.tsc"
    marker = tmp_path / "killed.pid"
    cluster = _cluster(allowed_failures=0)
    with cluster, distributed.Client(cluster) as c:
        with pytest.raises(distributed.KilledWorker) as info:
            tsc.build_store(
                images, out, workers=2, progress=False,
                loader=KillOnce(images[5], str(marker), str(out)),
                executor=c.get_executor(),
            )
        assert any(n.startswith("while building shard vectors/c/") for n in info.value.__notes__)
        assert marker.exists()
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if ".tsc-build-" in p.name]


# -- the same guarantees without Dask -------------------------------------------------


def _kill_during_write(task: ShardTask) -> None:
    """Run a shard task in this (child) process and die once its data is written, just before
    the file is renamed into place."""
    import tensorstore_cache.fs.durable as durable

    def die(*args: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    durable.os.replace = die  # type: ignore[attr-defined]
    run_shard(task)


def test_shard_task_killed_mid_write_then_retried(tmp_path: Path) -> None:
    images = write_images(tmp_path / "images", 10, seed=2)
    root = tmp_path / "build"
    (root / "vectors").mkdir(parents=True)
    task = ShardTask(
        root=str(root), rel="vectors/c/0/0/0/0", keys=images, loader=tsc.ImageLoader(size=(32, 32)),
        dtype="float32", item_shape=(3, 32, 32), rows_per_shard=16, write_on_failure=False,
    )
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_kill_during_write, args=(task,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    shard = root / task.rel
    partials = [p for p in shard.parent.iterdir() if parse_temp(p.name) is not None]
    assert len(partials) == 1 and not shard.exists()  # never a half-written shard
    result = run_shard(task)  # the retry
    again = run_shard(task)  # and a duplicate attempt: replaces, same bytes
    assert (result.size, result.checksum) == (again.size, again.checksum)
    assert file_digest(shard) == (result.size, result.checksum)
    assert remove_temps(root) == 1
    assert not [p for p in root.rglob("*") if parse_temp(p.name) is not None]


def test_late_task_of_an_abandoned_build_writes_nothing(tmp_path: Path) -> None:
    images = write_images(tmp_path / "images", 3, seed=4)
    root = tmp_path / "gone"  # a build directory already removed (or published)
    task = ShardTask(
        root=str(root), rel="vectors/c/0/0/0/0", keys=images, loader=tsc.ImageLoader(size=(32, 32)),
        dtype="float32", item_shape=(3, 32, 32), rows_per_shard=4, write_on_failure=False,
    )
    with pytest.raises(FileNotFoundError):
        run_shard(task)
    assert not root.exists()


class Die:
    """A loader that kills its process (declares its shape: never probed here)."""

    item_shape = (3, 32, 32)

    def __call__(self, path: str) -> np.ndarray:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


def test_local_pool_worker_killed_fails_cleanly(tmp_path: Path) -> None:
    images = write_images(tmp_path / "images", 8, seed=5)
    out = tmp_path / "s.tsc"
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool, pytest.raises(tsc.BuildError) as info:
        tsc.build_store(
            images, out, loader=Die(), loader_id="die", progress=False, executor=pool,
        )
    assert isinstance(info.value.__cause__, BrokenProcessPool)  # a pool cannot retry a task
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".tsc-build-" in p.name]
