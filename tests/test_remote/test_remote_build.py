"""Builds to an S3 URL that upload as they go, against a real S3 API (moto) on loopback.

Each shard task uploads the shard it wrote from the process that ran it; the
builder uploads the index and the metadata, the group ``zarr.json`` last. A
build that fails leaves no group ``zarr.json`` and deletes what it sent.
Skipped when ``moto[server]`` or ``s3fs`` is missing.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import tensorstore_cache as tsc

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from benchmarks.common.s3server import S3Process

from ..conftest import write_images

N_IMAGES = 300
BUCKET = "builds"


@dataclass(frozen=True)
class Gate:
    """Where a :class:`Recorder` waits: its call on the file ``name`` does not return before
    the S3 server at ``endpoint`` has answered a ``PUT`` of a key under ``under``."""

    name: str
    endpoint: str
    under: str

    def wait(self) -> None:
        """Return once such a PUT is answered; raise TimeoutError after two minutes."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{self.endpoint}/_tsc/log", timeout=30) as resp:
                log = json.loads(resp.read())
            if any(r["method"] == "PUT" and r["key"].startswith(self.under) and r["ended"]
                   for r in log):
                return
            time.sleep(0.01)
        raise TimeoutError(f"no PUT under {self.under} answered while {self.name} waited")


class Recorder:
    """The image loader, logging per call its pid, the time and the shard files under ``cache``.

    Fails on the file names in ``bad``; a process other than ``builder`` that
    meets the file named ``kill`` SIGKILLs itself. With ``meet`` (a directory),
    a process's first call notes its pid there and waits until two processes
    have: both compute, however late the pool's worker starts. With ``gate``,
    the call on its file waits for a shard's upload (:class:`Gate`) and is
    logged after it. With ``worker_calls``, the builder's first call waits
    until other processes (its pool's worker) have made that many.
    """

    item_shape = (3, 32, 32)
    params: ClassVar[dict[str, Any]] = {}

    def __init__(
        self, log: str, cache: str, bad: frozenset[str] = frozenset(), kill: str = "",
        builder: int = 0, meet: str = "", gate: Gate | None = None, worker_calls: int = 0,
    ) -> None:
        self.log = log
        self.cache = cache
        self.bad = bad
        self.kill = kill
        self.builder = builder
        self.meet = meet
        self.gate = gate
        self.met = False
        self.worker_calls = worker_calls
        self.image = tsc.ImageLoader(size=(32, 32))

    def __call__(self, path: str) -> np.ndarray:
        if self.worker_calls and os.getpid() == self.builder:
            _wait_for_calls(Path(self.log), self.builder, self.worker_calls)
            self.worker_calls = 0
        if os.path.basename(path) in self.bad:
            raise OSError(f"cannot read {path}")
        if os.path.basename(path) == self.kill and os.getpid() != self.builder:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.meet and not self.met:
            _meet(Path(self.meet))
            self.met = True
        if self.gate is not None and os.path.basename(path) == self.gate.name:
            self.gate.wait()
        staged = sum(1 for p in Path(self.cache).rglob("*") if p.is_file() and "/vectors/c/" in str(p))
        fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {time.monotonic()} {staged}\n".encode())
        finally:
            os.close(fd)
        return self.image(path)


def _meet(folder: Path) -> None:
    """Note this process in ``folder`` and wait until a second one has (two minutes at most)."""
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    while len(list(folder.iterdir())) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no second process computed within two minutes ({folder})")
        time.sleep(0.01)


def _wait_for_calls(log: Path, builder: int, count: int) -> None:
    """Wait until processes other than ``builder`` have logged ``count`` calls (a guard of
    120 s against a hang: the test then fails on what it checks)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if log.exists() and sum(pid != builder for pid, _t, _n in _calls(log)) >= count:
            return
        time.sleep(0.01)


def _calls(log: Path) -> list[tuple[int, float, int]]:
    return [(int(a), float(b), int(c)) for a, b, c in (ln.split() for ln in log.read_text().splitlines())]


def _all_rows(store: tsc.CacheStore) -> np.ndarray:
    return np.asarray(store.take(np.arange(len(store))))


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    root = tmp_path_factory.mktemp("remote-build")
    images = write_images(root / "images", N_IMAGES, seed=5, gray_every=11)
    tsc.build_store(images, root / "local.tsc", workers=1, progress=False).close()
    return images, root / "local.tsc"


def _listed(s3: S3Process, prefix: str) -> set[str]:
    import s3fs

    fs = s3fs.S3FileSystem(**s3.storage_options(), skip_instance_cache=True)
    return {p.split(f"{prefix}/", 1)[1] for p in fs.find(f"{BUCKET}/{prefix}")}


def test_workers_upload_their_shards_and_the_group_goes_last(
    s3: S3Process, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    images, local = sources
    url = f"s3://{BUCKET}/direct.tsc"
    log, cache, meet = tmp_path / "calls.log", tmp_path / "builder", tmp_path / "computing"
    meet.mkdir()
    # both processes compute; a source halfway is decoded only once a task has uploaded its
    # shard (a build that uploaded at the end would never get past it: its loader times out)
    gate = Gate(os.path.basename(images[N_IMAGES // 2]), s3.endpoint, f"{BUCKET}/direct.tsc/vectors/c/")
    s3.reset()
    built = tsc.build_store(
        images, url, workers=2, progress=False, cache_dir=cache,
        loader=Recorder(str(log), str(cache), meet=str(meet), gate=gate),
        loader_id="image-recorded", storage_options=s3.storage_options(),
    )
    calls = _calls(log)
    # two processes computed (and so uploaded) shards; none ever lay in the builder's cache
    assert len({pid for pid, _t, _n in calls}) == 2 == len(list(meet.iterdir()))
    assert all(n == 0 for _pid, _t, n in calls)
    puts = s3.requests("PUT", under=f"{BUCKET}/direct.tsc/")
    shard_puts = [r for r in puts if "/vectors/c/" in r.key]
    group = [r for r in puts if r.key == f"{BUCKET}/direct.tsc/zarr.json"]
    shards = {r.key for r in shard_puts}
    assert len(shards) == -(-N_IMAGES // built.spec.rows_per_shard) > 2
    # shards went up while sources were still being decoded, the group zarr.json after all else
    assert min(r.ended for r in shard_puts) < max(t for _pid, t, _n in calls)
    assert len(group) == 1
    assert all(r.ended <= group[0].started for r in puts if r is not group[0])
    # the builder's copy is the index and metadata only: its shards are fetched when read
    assert not list(Path(built.location).glob("vectors/c/**/0"))
    reference = tsc.open_store(local)
    np.testing.assert_array_equal(_all_rows(built), _all_rows(reference))
    with tsc.open_store(url, cache_dir=tmp_path / "reader", storage_options=s3.storage_options()) as other:
        assert other.paths == reference.paths
        np.testing.assert_array_equal(_all_rows(other), _all_rows(reference))
        other.verify()
    # no staging directory is left behind
    assert not [p for p in (cache / "remote").glob("*/.*") if p.is_dir()]


def test_a_failed_build_publishes_no_group_and_deletes_its_shards(
    s3: S3Process, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    images, _local = sources
    url = f"s3://{BUCKET}/failed.tsc"
    cache = tmp_path / "builder"
    bad = frozenset({os.path.basename(images[N_IMAGES // 2])})
    s3.reset()
    with pytest.raises(tsc.BuildError, match="1 of 300 sources") as err:
        tsc.build_store(
            images, url, workers=2, progress=False, cache_dir=cache,
            loader=Recorder(str(tmp_path / "calls.log"), str(cache), bad), loader_id="image-bad",
            storage_options=s3.storage_options(),
        )
    assert "s3://builds/failed.tsc" in str(err.value)
    # shards were sent during the build, then deleted: nothing is left, no group ever written
    assert [r for r in s3.requests("PUT", under=f"{BUCKET}/failed.tsc/") if "/vectors/c/" in r.key]
    assert not s3.requests("PUT", under=f"{BUCKET}/failed.tsc/zarr.json")
    assert _listed(s3, "failed.tsc") == set()
    with pytest.raises(tsc.StoreNotFoundError):
        tsc.open_store(url, cache_dir=tmp_path / "reader", storage_options=s3.storage_options())
    assert not [p for p in (cache / "remote").glob("*/.*") if p.is_dir()]


def test_a_worker_killed_mid_build_leaves_no_group_and_no_shards(
    s3: S3Process, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    images, _local = sources
    url = f"s3://{BUCKET}/killed.tsc"
    cache = tmp_path / "builder"
    # the pool's worker takes the first shards, the builder the last: the worker uploads
    # shard 0, then dies in shard 1 (64 rows a shard here), which the builder, waiting until
    # the worker is into it, cannot take back
    loader = Recorder(str(tmp_path / "calls.log"), str(cache), kill=os.path.basename(images[70]),
                      builder=os.getpid(), worker_calls=65)
    s3.reset()
    with pytest.raises(tsc.BuildError, match="died"):
        tsc.build_store(images, url, workers=2, progress=False, cache_dir=cache, loader=loader,
                        loader_id="image-killed", storage_options=s3.storage_options())
    assert f"{BUCKET}/killed.tsc/vectors/c/0/0/0/0" in {
        r.key for r in s3.requests("PUT", under=f"{BUCKET}/killed.tsc/")
    }
    assert _listed(s3, "killed.tsc") == set()
    assert not [p for p in (cache / "remote").glob("*/.*") if p.is_dir()]


def test_a_failed_overwrite_leaves_no_store_and_a_good_one_deletes_stale_shards(
    s3: S3Process, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    images, local = sources
    url = f"s3://{BUCKET}/replaced.tsc"
    options = s3.storage_options()
    first = tsc.build_store(images, url, workers=2, progress=False, cache_dir=tmp_path / "b",
                            storage_options=options)
    many = _listed(s3, "replaced.tsc")
    first.close()
    with pytest.raises(tsc.StoreExistsError):
        tsc.build_store(images, url, workers=1, progress=False, cache_dir=tmp_path / "b",
                        storage_options=options)
    # the old store is withdrawn when an overwrite starts, since shards are replaced in place
    bad = frozenset({os.path.basename(images[3])})
    with pytest.raises(tsc.BuildError):
        tsc.build_store(
            images, url, workers=2, progress=False, cache_dir=tmp_path / "b", overwrite=True,
            loader=Recorder(str(tmp_path / "calls.log"), str(tmp_path / "b"), bad),
            loader_id="image-bad", storage_options=options,
        )
    assert _listed(s3, "replaced.tsc") == set()
    # a smaller store over a larger one: the shards it does not list are gone
    tsc.build_store(images[:200], url, workers=2, progress=False, cache_dir=tmp_path / "b",
                    storage_options=options)
    smaller = tsc.build_store(images[:40], url, workers=1, progress=False, cache_dir=tmp_path / "b",
                              storage_options=options, overwrite=True)
    listed = _listed(s3, "replaced.tsc")
    assert len(listed) < len(many)
    with tsc.open_store(url, cache_dir=tmp_path / "r", storage_options=options) as other:
        other.verify()
    reference = tsc.open_store(local)
    np.testing.assert_array_equal(_all_rows(smaller), reference.take(np.arange(40)))


def test_skip_mode_rewrites_uploaded_shards_without_the_failed_rows(
    s3: S3Process, sources: tuple[list[str], Path], tmp_path: Path
) -> None:
    images, local = sources
    url = f"s3://{BUCKET}/skipped.tsc"
    bad_rows = [0, 150, 299]
    bad = frozenset(os.path.basename(images[i]) for i in bad_rows)
    store = tsc.build_store(
        images, url, workers=2, progress=False, on_error="skip", cache_dir=tmp_path / "b",
        loader=Recorder(str(tmp_path / "calls.log"), str(tmp_path / "b"), bad),
        loader_id="image-bad", storage_options=s3.storage_options(),
    )
    keep = [i for i in range(N_IMAGES) if i not in bad_rows]
    assert len(store) == len(keep) and len(store.spec.skipped) == 3
    reference = tsc.open_store(local)
    with tsc.open_store(url, cache_dir=tmp_path / "r", storage_options=s3.storage_options()) as other:
        other.verify()
        np.testing.assert_array_equal(_all_rows(other), reference.take(np.array(keep)))
    assert not [p for p in (tmp_path / "b" / "remote").glob("*/.*") if p.is_dir()]
