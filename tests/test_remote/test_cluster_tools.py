"""The tools on a prefix shared by ``cached(remote=...)``: ``list_caches(remote=)``,
``gc(remote=)`` and ``tensorstore-cache ls/gc --remote``, on a namespace of several
generations (incremental calls, then a merge past 4 parts), against the test S3
server and on a shared directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.common.s3server import S3Process
from tensorstore_cache.remote import LeaseTimes, acquire, objects_at

BUCKET = "tools"
KEYS = [f"item/{i:03d}" for i in range(30)]
ROOT = Path(__file__).resolve().parents[2]


def _vector(key: str) -> np.ndarray:
    return np.full(4, int(key.rsplit("/", 1)[1]), np.float32)


def _call(remote: str, options: dict[str, Any] | None, cache: Path, keys: list[str],
          log: list[str] | None = None) -> None:
    def loader(key: str) -> np.ndarray:
        if log is not None:
            log.append(key)
        return _vector(key)

    store = tsc.cached(keys, cache_dir=cache, remote=remote, storage_options=options,
                       loader=loader, loader_id="tools.vec/1", identity="none", workers=1,
                       progress=False)
    try:
        np.testing.assert_array_equal(store.take(store.rows(keys)),
                                      np.stack([_vector(k) for k in keys]))
    finally:
        store.close()


def _generations(remote: str, options: dict[str, Any] | None, cache: Path) -> str:
    """Six incremental calls: the fifth part makes the holder merge them (generation 6 names
    one part), the sixth adds one (generation 7: two parts); then a part uploaded by a holder
    that never committed. The namespace's name."""
    for n in range(5, 31, 5):
        _call(remote, options, cache, KEYS[:n])
    objects = objects_at(remote, options)
    [info] = tsc.list_caches(remote=remote, storage_options=options)
    stray = cache / "stray.tar"
    stray.write_bytes(b"an upload never committed")
    objects.put_file(stray, f"{info.namespace}/parts/0000000a-deadbeef.tar")
    return info.namespace


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorstore_cache", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture
def s3_prefix(s3: S3Process, request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    s3.inject([])
    yield f"s3://{BUCKET}/{request.node.name}", s3.storage_options()


def test_ls_and_gc_on_s3(s3: S3Process, s3_prefix: tuple[str, Any], tmp_path: Path) -> None:
    """list_caches(remote=) shows the generation, the parts the current one names and the
    current lease's holder and age; gc(remote=) deletes nothing younger than older_than;
    ``tensorstore-cache ls/gc --remote`` (credentials from ``FSSPEC_S3_*``) list the same and
    delete (``--older-than 0``) every superseded part, the stray upload, the old leases and the
    probe, never a manifest or a part in use: a fresh node then computes nothing."""
    remote, options = s3_prefix
    name = _generations(remote, options, tmp_path / "n0")
    [info] = tsc.list_caches(remote=remote, storage_options=options)
    assert (info.namespace, info.generation, info.generations, info.parts) == (name, 7, 7, 2)
    assert info.lease is None  # nobody builds on generation 7
    objects = objects_at(remote, options)
    lease = acquire(objects, f"{name}/leases", 7, lambda: False, LeaseTimes(), None)
    assert lease is not None
    try:
        [held] = tsc.list_caches(remote=remote, storage_options=options)
    finally:
        lease.release()
    assert held.lease == f"held by {os.uname().nodename} (pid {os.getpid()})"
    assert held.lease_age is not None and 0 <= held.lease_age < 3600
    assert tsc.gc(remote=remote, storage_options=options, older_than=3600) == []
    would = tsc.gc(remote=remote, storage_options=options, older_than=0, dry_run=True)
    kinds = sorted(r.kind for r in would)
    assert kinds.count("remote-part") == 6  # five merged, one stray
    assert kinds.count("remote-lease") >= 6 and "remote-probe" in kinds
    assert any("never committed" in r.reason for r in would)

    env = dict(os.environ, FSSPEC_S3_ENDPOINT_URL=s3.endpoint, FSSPEC_S3_KEY="testing",
               FSSPEC_S3_SECRET="testing", AWS_DEFAULT_REGION="us-east-1")
    listed = _cli("ls", "--remote", remote, env=env)
    assert listed.returncode == 0, listed.stderr
    assert name in listed.stdout and "7 of 7" in listed.stdout
    as_json = json.loads(_cli("ls", "--remote", remote, "--json", env=env).stdout)
    assert [(c["namespace"], c["generation"], c["parts"]) for c in as_json] == [(name, 7, 2)]
    refused = _cli("gc", "--remote", remote, env=env)
    assert refused.returncode == 2 and "--older-than" in refused.stderr
    done = _cli("gc", "--remote", remote, "--older-than", "0", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("removed remote-part") == 6
    [after] = tsc.list_caches(remote=remote, storage_options=options)
    assert (after.generation, after.generations, after.parts) == (7, 7, 2)
    log: list[str] = []
    _call(remote, options, tmp_path / "fresh", KEYS, log)
    assert log == []


def test_gc_keeps_what_is_out_of_use_for_less_than_its_age(tmp_path: Path) -> None:
    """On a shared directory whose merge was committed two days ago: gc with older_than of
    one day deletes the five merged parts, not the stray upload of an hour ago."""
    shared = tmp_path / "shared"
    shared.mkdir()
    name = _generations(str(shared), None, tmp_path / "n0")
    two_days = time.time() - 2 * 86400
    for path in [*(shared / name / "manifests").glob("*.json"), *shared.rglob("parts/*")]:
        if path.name != "0000000a-deadbeef.tar":
            os.utime(path, (two_days, two_days))
    hour = time.time() - 3600
    os.utime(shared / name / "parts" / "0000000a-deadbeef.tar", (hour, hour))
    removed = tsc.gc(remote=str(shared), older_than=86400)
    parts = sorted(r.path for r in removed if r.kind == "remote-part")
    assert len(parts) == 5 and not any("deadbeef" in p for p in parts)
    assert (shared / name / "parts" / "0000000a-deadbeef.tar").exists()
    with pytest.raises(ValueError, match="older_than"):
        tsc.gc(remote=str(shared))

