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
from tensorstore_cache.format.keys import normalize_key
from tensorstore_cache.format.metadata import GroupMetadata
from tensorstore_cache.fs.durable import PARTIAL_SUFFIX, file_digest, remove_partials
from tensorstore_cache.writer.tasks import ShardTask, run_shard

from .conftest import write_images

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
            try:
                fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                self._leave_debris()
                os.kill(os.getpid(), signal.SIGKILL)
        return self.image(path)

    def _leave_debris(self) -> None:
        # What an attempt killed during its write would leave, and worse: a torn
        # file at the shard's own path (the retry must replace both safely).
        out = Path(self.out)
        for build in out.parent.glob(f".{out.name}.tsc-build-*"):
            shard = build / "vectors" / "c" / "0" / "0" / "0" / "0"
            shard.parent.mkdir(parents=True, exist_ok=True)
            shard.with_name(f"0.{'ab' * 16}{PARTIAL_SUFFIX}").write_bytes(b"\x00" * 1000)
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
    return store.take(np.arange(len(store)))


def _assert_intact(out: Path) -> None:
    """Every file listed in the metadata has its recorded size and checksum; no debris."""
    files = GroupMetadata.read(out).files
    for rel, (size, digest) in files.items():
        assert file_digest(out / rel) == (size, digest), rel
    leftovers = [p for p in out.rglob("*") if p.is_file() and p.name.endswith(PARTIAL_SUFFIX)]
    assert leftovers == []
    assert not list(out.parent.glob(f".{out.name}.tsc-build-*"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    root = tmp_path_factory.mktemp("dask")
    images = write_images(root / "images", N_IMAGES, seed=11, gray_every=13)
    reference = tsc.build_store(images, root / "local.tsc", workers=1, progress=False)
    reference.close()
    return images, root / "local.tsc"


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
    client: Any, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from benchmarks.s3server import S3Process

    images, local = sources
    server = S3Process()
    try:
        server.create_bucket("cluster")
        store = tsc.build_store(
            images, "s3://cluster/dask.tsc", workers=2, progress=False,
            executor=client.get_executor(), cache_dir=tmp_path / "builder",
            storage_options=server.storage_options(),
        )
        # no shard lies in the builder's copy: the Dask workers uploaded them
        assert not list(Path(store.location).glob("vectors/c/**/0"))
        puts = server.requests("PUT", under="cluster/dask.tsc/")
        assert len([r for r in puts if "/vectors/c/" in r.key]) == -(-len(images) // store.spec.rows_per_shard)
        assert puts[-1].key == "cluster/dask.tsc/zarr.json"
        reference = tsc.open_store(local)
        np.testing.assert_array_equal(_all_rows(store), _all_rows(reference))
        store.verify()
    finally:
        server.stop()


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
    assert victim in pids_before  # a worker process really died ...
    client.wait_for_workers(2)
    assert victim not in set(client.run(os.getpid).values())  # ... and was replaced
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
    """Run a shard task in this (child) process and die just before its data is durable."""
    import tensorstore_cache.fs.durable as durable

    def die(fd: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    durable.os.fsync = die  # type: ignore[attr-defined]
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
    partials = list(shard.parent.glob(f"*{PARTIAL_SUFFIX}"))
    assert len(partials) == 1 and not shard.exists()  # never a half-written shard
    result = run_shard(task)  # the retry
    again = run_shard(task)  # and a duplicate attempt: replaces, same bytes
    assert (result.size, result.checksum) == (again.size, again.checksum)
    assert file_digest(shard) == (result.size, result.checksum)
    assert remove_partials(root) == 1
    assert not list(root.rglob(f"*{PARTIAL_SUFFIX}"))


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
            size=(32, 32),
        )
    assert isinstance(info.value.__cause__, BrokenProcessPool)  # a pool cannot retry a task
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".tsc-build-" in p.name]
