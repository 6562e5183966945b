"""Every kind of cache through ``remote=``: records, a ``BatchLoader``, and each kind of
``identity=``; 3 nodes start at once on the S3 test server, each key is computed once in the
cluster (counted by the loaders' ``O_APPEND`` log, ``tests.support._cluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common.s3server import S3Process
from tests.support._cluster import computed, computed_by, launch, spec_env

pytest.importorskip("s3fs")

BUCKET = "kinds"
KEYS = [f"item/{i:03d}" for i in range(16)]


@pytest.fixture
def prefix(s3: S3Process, request: pytest.FixtureRequest) -> Iterator[str]:
    s3.inject([])
    yield f"s3://{BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}"


def _three_nodes(work: Path, keys: list[str], remote: str, options: dict[str, Any] | None,
                 **spec: Any) -> None:
    log = work / "log"
    start = work / "start"
    agents = [launch(work, f"n{n}", keys, remote, spec_env(log, ttl=3.0,
                                                            extra={"CLUSTER_NODE": f"n{n}"}),
                     storage_options=options, start=start, **spec) for n in range(3)]
    for agent in agents:
        agent.wait_ready()
    start.touch()
    for agent in agents:
        verdict = agent.result()
        assert verdict["ok"], verdict.get("traceback") or verdict
        assert verdict["wrong"] == 0


@pytest.mark.parametrize(("loader", "identity"), [("records", "token"), ("batch", "none")])
def test_once_per_cluster(s3: S3Process, prefix: str, tmp_path: Path, loader: str,
                          identity: str) -> None:
    """A store of records (a vector and a text field, version tokens as identity) and a
    BatchLoader's build (device workers): 3 nodes at once, each key computed once."""
    _three_nodes(tmp_path, KEYS, prefix, s3.storage_options(), loader=loader,
                 identity=identity)
    counts = computed(tmp_path / "log")
    assert sorted(counts) == KEYS and max(counts.values()) == 1


def test_content_identity_on_copies(prefix: str, s3: S3Process, tmp_path: Path) -> None:
    """``identity="content"``: 3 nodes whose sources are copies of one another (other mtimes)
    build once in the cluster, and every node gets the vectors of its own bytes."""
    files = [f"data/f{i}.bin" for i in range(8)]
    for n in range(3):
        for i, rel in enumerate(files):
            path = tmp_path / f"n{n}-data" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes([i + 1]) * 64)
    log = tmp_path / "log"
    start = tmp_path / "start"
    agents = [launch(tmp_path, f"n{n}", files, prefix,
                     spec_env(log, ttl=3.0, extra={"CLUSTER_NODE": f"n{n}"}),
                     storage_options=s3.storage_options(), start=start, loader="file",
                     identity="content", cwd=str(tmp_path / f"n{n}-data")) for n in range(3)]
    for agent in agents:
        agent.wait_ready()
    start.touch()
    for agent in agents:
        verdict = agent.result()
        assert verdict["ok"], verdict.get("traceback") or verdict
        assert verdict["wrong"] == 0
    assert sorted(key for _node, key in computed_by(log)) == sorted(files)
