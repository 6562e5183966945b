"""Sources copied to each machine keep their vectors under ``remote=`` and ``identity="stat"``.

Each "node" has its own copy of the sources (new mtimes, the same bytes) under
its own directory, and its agents run there with the keys as relative paths
(the way to give nodes the same keys whatever their mount point). The loader
makes each vector from the file's bytes and logs ``<node> <key>``; every agent
checks the vectors it got against its own copy's bytes, and counts the
sources it read whole to compare their content hash.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common.s3server import S3Process
from tests.support._cluster import computed_by, launch, spec_env

BUCKET = "copied"
FILES = [f"data/d{i % 3}/f{i:02d}.bin" for i in range(12)]
TTL = 3.0


def _write(root: Path, *, mtime: float) -> None:
    for i, rel in enumerate(FILES):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i]) * (100 + i))
        os.utime(path, (mtime, mtime))


def _copy(src: Path, dst: Path, *, mtime: float) -> None:
    """A copy of every source, as ``cp`` makes it, then dated ``mtime`` (not racily recent)."""
    for rel in FILES:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)
        os.utime(dst / rel, (mtime, mtime))


@pytest.fixture(params=["s3", "directory"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    if request.param == "directory":
        shared = tmp_path / "shared"
        shared.mkdir()
        yield str(shared), None
        return
    pytest.importorskip("s3fs")
    s3: S3Process = request.getfixturevalue("s3")
    s3.inject([])
    yield f"s3://{BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}", s3.storage_options()


def _run(work: Path, nodes: dict[str, int], remote: tuple[str, Any],
         log: Path) -> dict[str, list[dict[str, Any]]]:
    """Start ``nodes`` (name: agents) at once, each agent in its node's copy; their verdicts."""
    url, options = remote
    start = work / f"start-{time.monotonic_ns()}"
    running = [(node, launch(work, node, FILES, url,
                             spec_env(log, ttl=TTL, extra={"CLUSTER_NODE": node}),
                             storage_options=options, start=start, loader="file",
                             cwd=str(work / f"{node}-data")))
               for node, agents in nodes.items() for _ in range(agents)]
    for _node, agent in running:
        agent.wait_ready()
    start.touch()
    verdicts: dict[str, list[dict[str, Any]]] = {}
    for node, agent in running:
        v = agent.result()
        assert v["ok"], v.get("traceback") or v
        assert v["wrong"] == 0, v  # the vectors of this node's own bytes
        verdicts.setdefault(node, []).append(v)
    return verdicts


def _reads(verdicts: list[dict[str, Any]]) -> int:
    return sum(v["content_reads"] for v in verdicts)


def test_copied_sources_keep_their_vectors(remote: tuple[str, Any], tmp_path: Path) -> None:
    """Node n0 builds; nodes n1 and n2, whose sources are copies with other mtimes, compute
    nothing (each source read once, to compare its hash) and their next call reads no
    source; a source rewritten on n2 is recomputed there, only there, and the other nodes
    keep the cluster's vector of it; the remote gets no second commit."""
    log = tmp_path / "log"
    now = time.time()
    _write(tmp_path / "n0-data", mtime=now - 3600)
    _run(tmp_path, {"n0": 1}, remote, log)
    assert sorted(computed_by(log)) == [("n0", k) for k in sorted(FILES)]

    for n, node in enumerate(("n1", "n2")):
        _copy(tmp_path / "n0-data", tmp_path / f"{node}-data", mtime=now - 600 - n)
    first = _run(tmp_path, {"n1": 2, "n2": 1}, remote, log)
    assert len(computed_by(log)) == len(FILES)  # nothing computed on n1 or n2
    # each source read once by n2, at most once by each agent of n1 (one may plan while the
    # other writes down what it found)
    assert _reads(first["n2"]) == len(FILES)
    assert len(FILES) <= _reads(first["n1"]) <= 2 * len(FILES)

    changed = tmp_path / "n2-data" / FILES[5]
    changed.write_bytes(b"other bytes")
    os.utime(changed, (now - 60, now - 60))
    again = _run(tmp_path, {"n0": 1, "n1": 1, "n2": 1}, remote, log)
    assert _reads(again["n0"]) == _reads(again["n1"]) == 0  # stats only
    last = _run(tmp_path, {"n2": 1}, remote, log)
    assert _reads(last["n2"]) == 0
    counts = computed_by(log)
    assert counts[("n2", FILES[5])] == 1
    assert sum(counts.values()) == len(FILES) + 1
    assert _manifests(remote) == 1  # n2's own vector never left it


def _manifests(remote: tuple[str, Any]) -> int:
    import fsspec.core

    fs, root = fsspec.core.url_to_fs(remote[0], **(remote[1] or {}))
    return len(fs.glob(f"{root}/*/manifests/*.json"))
