"""One cache for a cluster: cached(..., remote=...) computes each key once across machines.

Every "node" is a set of agent processes sharing one cache directory; nodes
share only the remote prefix: a real S3 API (moto in its own process, which
serialises conditional writes per key, counts every request and injects
faults: ``benchmarks.common.s3server``) or a shared directory. The loader logs
each key it computes with ``O_APPEND`` (``tests.support._cluster``), so
"once" is counted. Leases are short here (``$TSC_REMOTE_LEASE_TTL``); no test
asserts a duration.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common.s3server import Fault, S3Process
from tests.support._cluster import Agent, computed, launch, spec_env

pytest.importorskip("s3fs")

BUCKET = "cluster"
KEYS = [f"item/{i:03d}" for i in range(30)]
TTL = 1.5


@pytest.fixture
def prefix(s3: S3Process, request: pytest.FixtureRequest) -> Iterator[str]:
    s3.inject([])
    yield f"s3://{BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}"
    s3.inject([])


def _start_all(agents: list[Agent], start: Path) -> None:
    for agent in agents:
        agent.wait_ready()
    start.touch()


def _nodes(work: Path, remote: str, env_of: Any, *, nodes: int, agents: int,
           keys: list[str] = KEYS, **kw: Any) -> list[dict[str, Any]]:
    """Run ``nodes`` x ``agents`` agents at once; their verdicts."""
    start = work / f"start-{time.monotonic_ns()}"
    running = [launch(work, f"n{n}", keys, remote, env_of(n), start=start, **kw)
               for n in range(nodes) for _a in range(agents)]
    _start_all(running, start)
    return [a.result() for a in running]


def _assert_all_right(verdicts: list[dict[str, Any]]) -> None:
    for v in verdicts:
        assert v["ok"], v.get("traceback") or v
        assert v["wrong"] == 0


def _parts_named_exist(s3: S3Process, remote: str) -> int:
    """Assert every manifest under ``remote`` names parts whose bundle and store (its group
    zarr.json, uploaded last) exist; return the newest's part count."""
    import json

    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.storage_options())
    root = remote.removeprefix("s3://")
    newest = 0
    for path in sorted(fs.glob(f"{root}/*/manifests/*.json")):
        doc = json.loads(fs.cat_file(path))
        assert doc["kind"] == "tensorstore_cache.remote.manifest" and doc["version"] == 1
        ns = path.rsplit("/manifests/", 1)[0]
        for part in doc["parts"]:
            assert fs.exists(f"{ns}/parts/{part['id']}.bundle"), (path, part)
            assert fs.exists(f"{ns}/parts/{part['id']}/zarr.json"), (path, part)
        newest = len(doc["parts"])
    return newest


def _wait_for(path: Path, agent: Agent) -> None:
    deadline = time.monotonic() + 240  # hang guard
    while not path.exists():
        assert agent.proc.poll() is None and time.monotonic() < deadline, agent.result()
        time.sleep(0.02)


def test_once_per_cluster_on_s3(s3: S3Process, prefix: str, tmp_path: Path) -> None:
    """3 nodes x 2 agents at once: each key computed exactly once in the cluster, every agent
    gets the right vectors; two nodes' clocks are skewed (by +1e9 s and -1e5 s) and the
    build outlasts the lease, so only the heartbeat keeps the waiters from taking over.
    A later call with new keys computes only those, into a second part. Then the request
    counts: a warm node makes at most 1, a fresh node at most 4 + 2 per part before its first
    vector (the store probe included), then fetches each shard it reads once."""
    log = tmp_path / "log"
    skews = {0: "0", 1: "1e9", 2: "-1e5"}
    so = s3.storage_options()

    def env(n: int) -> dict[str, str]:
        return spec_env(log, ttl=TTL, sleep=0.1, extra={"TSC_TEST_CLOCK_SKEW": skews.get(n, "0")})

    verdicts = _nodes(tmp_path, prefix, env, nodes=3, agents=2, keys=KEYS[:24],
                      storage_options=so)
    _assert_all_right(verdicts)
    counts = computed(log)
    assert set(counts) == set(KEYS[:24])
    assert max(counts.values()) == 1, counts.most_common(3)
    [later] = _nodes(tmp_path, prefix, env, nodes=1, agents=1, storage_options=so)
    _assert_all_right([later])
    counts = computed(log)
    assert set(counts) == set(KEYS) and max(counts.values()) == 1
    parts = _parts_named_exist(s3, prefix)
    assert parts == 2

    s3.reset()  # a warm node: its node cache covers the keys (the shards its agents read too)
    [warm] = _nodes(tmp_path, prefix, env, nodes=1, agents=1, storage_options=so)
    _assert_all_right([warm])
    assert len(s3.log()) <= 1

    s3.reset()  # a fresh node on a warm remote
    opened, go = tmp_path / "fresh.opened", tmp_path / "fresh.go"
    fresh = launch(tmp_path, "fresh", KEYS, prefix, env(0), storage_options=so,
                   opened=str(opened), go=str(go))
    _wait_for(opened, fresh)
    before = s3.log()
    go.touch()
    _assert_all_right([fresh.result()])
    shown = [(r.method, r.key, r.status) for r in before]
    assert len(before) <= 4 + 2 * parts, shown
    shards = [r for r in s3.log()[len(before):] if r.method == "GET"]
    assert shards and all("/parts/" in r.key and not r.key.endswith(".bundle") for r in shards)
    assert len({r.key for r in shards}) == len(shards)  # each shard fetched once
    assert max(computed(log).values()) == 1


def test_once_per_cluster_on_a_shared_directory(tmp_path: Path) -> None:
    """The same protocol on a directory every node mounts: create-only by link(), no flock
    across nodes; 3 nodes x 2 agents, each key computed exactly once; a later call with
    new keys computes only those."""
    shared = tmp_path / "shared"
    shared.mkdir()
    log = tmp_path / "log"

    def env(n: int) -> dict[str, str]:
        return spec_env(log, ttl=TTL, sleep=0.05)

    verdicts = _nodes(tmp_path, str(shared), env, nodes=3, agents=2, keys=KEYS[:20])
    _assert_all_right(verdicts)
    counts = computed(log)
    assert set(counts) == set(KEYS[:20]) and max(counts.values()) == 1

    [later] = _nodes(tmp_path, str(shared), env, nodes=1, agents=1, keys=KEYS)
    _assert_all_right([later])
    counts = computed(log)
    assert set(counts) == set(KEYS) and max(counts.values()) == 1
    manifests = sorted((p for p in shared.glob("*/manifests/*.json")), key=lambda p: p.name)
    assert len(manifests) == 2  # two commits, never rewritten


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("stage", ["leased", "uploaded", "committed"])
def test_a_killed_lease_holder(s3: S3Process, prefix: str, tmp_path: Path, stage: str) -> None:
    """The lease holder is SIGKILLed before its first shard, after the upload but before the
    commit, or right after the commit (mid-upload: the next test): two nodes then take over once
    the lease has gone a lease time without a heartbeat (or find the commit). Each key is
    computed at most twice, every vector is right, no manifest names a missing object."""
    log = tmp_path / "log"
    so = s3.storage_options()
    doomed = launch(tmp_path, "doomed", KEYS, prefix,
                    spec_env(log, ttl=TTL, extra={"TSC_TEST_CLUSTER_STOP": f"{stage}:KILL"}),
                    storage_options=so)
    assert doomed.result()["returncode"] == -signal.SIGKILL
    verdicts = _nodes(tmp_path, prefix, lambda n: spec_env(log, ttl=TTL), nodes=2, agents=1,
                      storage_options=so)
    _assert_all_right(verdicts)
    counts = computed(log)
    assert set(counts) == set(KEYS)
    assert max(counts.values()) <= 2
    if stage == "committed":  # the commit landed: nobody computes again
        assert max(counts.values()) == 1
    _parts_named_exist(s3, prefix)


def test_a_holder_killed_mid_upload(s3: S3Process, prefix: str, tmp_path: Path) -> None:
    """The holder is SIGKILLed while the server holds its part's upload: the object never
    appears, no manifest names it, and two nodes take over; each key at most twice."""
    log = tmp_path / "log"
    so = s3.storage_options()
    s3.inject([Fault("stall", "/parts/", "PUT", count=1, seconds=20.0)])
    doomed = launch(tmp_path, "doomed", KEYS, prefix, spec_env(log, ttl=TTL), storage_options=so)
    deadline = time.monotonic() + 120  # hang guard
    while not any(r.startswith("PUT ") and "/parts/" in r for r in s3.stalled()):
        assert doomed.proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    doomed.proc.kill()
    assert doomed.result()["returncode"] == -signal.SIGKILL
    verdicts = _nodes(tmp_path, prefix, lambda n: spec_env(log, ttl=TTL), nodes=2, agents=1,
                      storage_options=so)
    _assert_all_right(verdicts)
    counts = computed(log)
    assert set(counts) == set(KEYS) and set(counts.values()) == {2}
    _parts_named_exist(s3, prefix)


def test_a_holder_stopped_past_its_lease(s3: S3Process, prefix: str, tmp_path: Path) -> None:
    """A holder SIGSTOPped after building, past its lease: another node takes over and
    commits; resumed, the first one loses its commit, adopts the winner's, and returns the
    right vectors too. Each key computed exactly twice."""
    log = tmp_path / "log"
    so = s3.storage_options()
    paused = launch(tmp_path, "paused", KEYS, prefix,
                    spec_env(log, ttl=TTL, extra={"TSC_TEST_CLUSTER_STOP": "built:STOP"}),
                    storage_options=so)
    deadline = time.monotonic() + 120  # hang guard
    while not _stopped(paused.proc.pid):
        assert paused.proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    taker = launch(tmp_path, "taker", KEYS, prefix, spec_env(log, ttl=TTL), storage_options=so)
    _assert_all_right([taker.result()])
    os.kill(paused.proc.pid, signal.SIGCONT)
    _assert_all_right([paused.result()])
    assert set(computed(log).values()) == {2}
    _parts_named_exist(s3, prefix)


def test_a_flaky_server(s3: S3Process, prefix: str, tmp_path: Path) -> None:
    """Lost responses (the write applied, the answer lost, the client retries into 412),
    409 conflicts, bursts of 503 and a stall, on the commits, leases and reads of 3 nodes
    starting at once: every vector right, each key at most twice, and the faults were served."""
    s3.reset()
    s3.inject([
        Fault("lost", "/manifests/", "PUT", count=2),
        Fault("conflict", "/leases/", "PUT", count=2),
        Fault("slowdown", "/manifests/", "GET", count=6),
        Fault("lost", "/parts/", "PUT", count=1),
        Fault("stall", "/head.json", "GET", count=1, seconds=2.0),
    ])
    log = tmp_path / "log"
    verdicts = _nodes(tmp_path, prefix, lambda n: spec_env(log, ttl=TTL), nodes=3, agents=1,
                      storage_options=s3.storage_options())
    _assert_all_right(verdicts)
    counts = computed(log)
    assert set(counts) == set(KEYS) and max(counts.values()) <= 2
    statuses = {r.status for r in s3.log()}
    assert {500, 409, 503} <= statuses
    _parts_named_exist(s3, prefix)


def test_answers_later_than_the_clients_read_timeout(s3: S3Process, prefix: str,
                                                    tmp_path: Path) -> None:
    """The server applies the first create of the store probe, of a lease and of a manifest
    but answers each only once the client, past its read timeout (1 s here), has sent it
    again: the retry is told 412, the object read back holds the client's own token, so each
    is recognised as its own create (a false "exists" would refuse the store as ignoring
    create-only writes, or wait on its own lease). 2 nodes: each key computed exactly once,
    every vector right."""
    s3.inject([Fault("late", "/.tsc-probe/", "PUT", count=1, seconds=5.0),
               Fault("late", "/leases/", "PUT", count=1, seconds=5.0),
               Fault("late", "/manifests/", "PUT", count=1, seconds=5.0)])
    so = {**s3.storage_options(), "config_kwargs": {"read_timeout": 1}}
    log = tmp_path / "log"
    verdicts = _nodes(tmp_path, prefix, lambda n: spec_env(log, ttl=TTL), nodes=2, agents=1,
                      storage_options=so)
    _assert_all_right(verdicts)
    counts = computed(log)
    assert set(counts) == set(KEYS) and max(counts.values()) == 1
    puts = s3.requests("PUT", prefix.removeprefix("s3://"))
    for where in ("/.tsc-probe/", "/leases/", "/manifests/"):
        answers: dict[str, set[int]] = {}
        for r in puts:
            if where in r.key:
                answers.setdefault(r.key, set()).add(r.status)
        assert any({200, 412} <= found for found in answers.values()), (where, answers)
    _parts_named_exist(s3, prefix)


def test_a_store_ignoring_conditions_is_refused(s3: S3Process, prefix: str,
                                                 tmp_path: Path) -> None:
    """A server that drops If-None-Match is refused at first use (UnsafeRemoteError naming
    it), and the verdict is remembered by the node: the next call probes no more."""
    s3.inject([Fault("ignore_conditions", "", "PUT", count=-1)])
    log = tmp_path / "log"
    first = launch(tmp_path, "n0", KEYS, prefix, spec_env(log), storage_options=s3.storage_options())
    verdict = first.result()
    assert verdict["error"] == "UnsafeRemoteError", verdict
    assert prefix in verdict["message"]
    s3.reset()
    again = launch(tmp_path, "n0", KEYS, prefix, spec_env(log), storage_options=s3.storage_options())
    assert again.result()["error"] == "UnsafeRemoteError"
    assert s3.log() == []
    assert not log.exists()  # nothing computed
