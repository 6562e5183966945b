"""The pieces of the cluster cache's commit: create-only objects, the probe, the lease.

Against the test S3 server (moto in its own process; it serialises conditional
writes per key, counts requests and injects faults) and a local directory.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc
from benchmarks.common.s3server import Fault, S3Process
from tensorstore_cache.remote import (
    DirectoryObjects,
    LeaseTimes,
    S3Objects,
    acquire,
    check_conditional,
    document,
    monotonic,
)
from tests.support._cluster import launch, spec_env

pytest.importorskip("s3fs")

BUCKET = "protocol"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def objects(s3: S3Process, request: pytest.FixtureRequest) -> S3Objects:
    s3.inject([])
    s3.reset()
    return S3Objects(f"s3://{BUCKET}/{request.node.name}", s3.storage_options())


def _create_in_child(root: str, token: str, out: multiprocessing.Queue[bool]) -> None:
    out.put(DirectoryObjects(Path(root)).create("manifests/1.json", {"n": 1}, token))


def test_directory_create_only_once_among_processes(tmp_path: Path) -> None:
    """8 processes create one name at once: exactly one wins; a retried create of the
    winner (its write landed, it did not hear so) is recognised by its token."""
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[bool] = ctx.Queue()
    procs = [ctx.Process(target=_create_in_child, args=(str(tmp_path), f"t{i}", out))
             for i in range(8)]
    for p in procs:
        p.start()
    wins = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    assert wins.count(True) == 1
    objs = DirectoryObjects(tmp_path)
    doc = objs.read_json("manifests/1.json")
    assert doc is not None
    assert objs.create("manifests/1.json", {"n": 1}, doc["writer"]) is True
    assert objs.create("manifests/1.json", {"n": 1}, "someone else") is False
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temporary file left


def test_s3_create_only_under_threads(objects: S3Objects, s3: S3Process) -> None:
    """16 threads create one object at once through the server (which serialises conditional
    writes per key, as S3 does): exactly one wins, the others are told 412."""
    results: list[bool] = []
    barrier = threading.Barrier(16)

    def one(i: int) -> None:
        barrier.wait()
        results.append(objects.create("x.json", {"i": i}, f"token{i}"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results.count(True) == 1
    puts = s3.requests("PUT", f"{BUCKET}/")
    assert sorted(r.status for r in puts) == [200] + [412] * 15


def test_s3_lost_response_is_recognised_by_token(objects: S3Objects, s3: S3Process) -> None:
    """The server applies a create and loses the answer; the client retries into 412, reads
    the object back and finds its own token: created. Another writer's create fails."""
    s3.inject([Fault("lost", "lost.json", "PUT", count=1)])
    assert objects.create("lost.json", {"v": 1}, "mine") is True
    statuses = [r.status for r in s3.requests("PUT", f"{BUCKET}/")]
    assert statuses[:2] == [500, 412]
    assert objects.create("lost.json", {"v": 2}, "theirs") is False
    doc = objects.read_json("lost.json")
    assert doc == {"v": 1, "writer": "mine"}


def test_s3_conflicts_and_slowdowns_are_retried(objects: S3Objects, s3: S3Process) -> None:
    """409 ConditionalRequestConflict and a burst of 503 SlowDown clear on their own."""
    s3.inject([Fault("conflict", "c.json", "PUT", count=2),
               Fault("slowdown", "c.json", "GET", count=3)])
    assert objects.create("c.json", {}, "mine") is True
    assert objects.read_json("c.json") == {"writer": "mine"}
    statuses = {r.status for r in s3.log()}
    assert {409, 503} <= statuses


def test_a_missing_object_is_absent_not_corrupt(objects: S3Objects) -> None:
    assert objects.read("nothing.json") is None
    assert objects.read_json("nothing.json") is None


def test_probe_refuses_a_store_ignoring_conditions(objects: S3Objects, s3: S3Process,
                                                   tmp_path: Path) -> None:
    """The probe creates one object twice: honoured, the verdict is kept and later calls make
    no request; ignored, UnsafeRemoteError names the store and the verdict file."""
    verdicts = tmp_path / "ok.json"
    check_conditional(objects, verdicts)
    assert len(s3.requests("PUT", f"{BUCKET}/")) == 2  # the header reaches the server
    s3.reset()
    check_conditional(objects, verdicts)
    assert s3.log() == []
    s3.inject([Fault("ignore_conditions", "", "PUT", count=-1)])
    refused = tmp_path / "refused.json"
    with pytest.raises(tsc.UnsafeRemoteError, match="ignores create-only writes") as err:
        check_conditional(objects, refused)
    assert isinstance(err.value, OSError) and str(refused) in str(err.value)
    check_conditional(DirectoryObjects(tmp_path / "dir"), tmp_path / "dir.json")


def test_a_waiter_makes_at_most_two_requests_a_poll(objects: S3Objects, s3: S3Process) -> None:
    """While another holds the lease (heart-beaten), a waiter reads the next manifest and the
    lease once per poll until the manifest appears (here at its 5th poll: acquire then
    returns None, someone committed); with a deadline it gives up (StoreLockedError, a
    TimeoutError)."""
    times = LeaseTimes(ttl=60, heartbeat=0.05, poll_min=0.01, poll_max=0.02)
    lease = acquire(objects, "ns/leases", 0, lambda: False, times, None)
    assert lease is not None
    try:
        s3.reset()
        polls = 0

        def committed() -> bool:
            nonlocal polls
            polls += 1
            found = objects.read("ns/manifests/00000001.json") is not None
            if polls == 4:  # the commit lands between two polls
                objects.create("ns/manifests/00000001.json", {"parts": []}, "holder")
            return found

        assert acquire(objects, "ns/leases", 0, committed, times, None) is None
        gets = s3.requests("GET", f"{BUCKET}/")
        create = [r for r in s3.requests("PUT", f"{BUCKET}/") if r.status == 412]
        assert polls == 5 and len(create) == 1
        assert len(gets) <= 2 * polls + 1  # + the read after the failed create
        with pytest.raises(TimeoutError):
            acquire(objects, "ns/leases", 0, lambda: False, times, monotonic() + 0.2)
    finally:
        lease.release()


def test_a_silent_lease_is_taken_over(tmp_path: Path) -> None:
    """A lease whose holder died (no heartbeat) is taken over once it has been unchanged for
    a lease time on the waiter's clock: the waiter holds the next attempt."""
    objs = DirectoryObjects(tmp_path)
    dead = document("lease", {"beats": 0, "state": "held", "host": "gone", "pid": 1})
    assert objs.create("ns/leases/g00000000.a0000.json", dead, "dead")
    times = LeaseTimes(ttl=0.3, heartbeat=0.05, poll_min=0.01, poll_max=0.05)
    lease = acquire(objs, "ns/leases", 0, lambda: False, times, None)
    assert lease is not None
    try:
        assert lease.rel == "ns/leases/g00000000.a0001.json"
    finally:
        lease.release()
    assert objs.read_json(lease.rel)["state"] == "released"  # type: ignore[index]


def test_lease_time_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TSC_REMOTE_LEASE_TTL", raising=False)
    assert LeaseTimes.from_env() == LeaseTimes(60.0, 10.0, 0.5, 5.0)
    monkeypatch.setenv("TSC_REMOTE_LEASE_TTL", "12")
    assert LeaseTimes.from_env().ttl == 12 and LeaseTimes.from_env().heartbeat == 2
    monkeypatch.setenv("TSC_REMOTE_LEASE_TTL", "soon")
    with pytest.raises(ValueError, match="TSC_REMOTE_LEASE_TTL"):
        LeaseTimes.from_env()


def test_remote_arguments_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def load(p: str) -> np.ndarray:
        return np.zeros(2, np.float32)

    kw = {"cache_dir": tmp_path / "c", "loader": load, "loader_id": "t/1", "identity": "none",
          "progress": False}
    with pytest.raises(ValueError, match="neither a URL nor an existing directory"):
        tsc.cached(["a"], remote=str(tmp_path / "nowhere"), **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without remote"):
        tsc.cached(["a"], storage_options={}, **kw)  # type: ignore[arg-type]
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("TSC_REMOTE", str(shared))
    store = tsc.cached(["a", "b"], **kw)  # type: ignore[arg-type]
    assert len(store) == 2 and list(shared.glob("*/manifests/*.json"))


def test_lock_timeout_bounds_the_wait_for_another_machines_lease(tmp_path: Path) -> None:
    """A node waiting for another node's live lease gives up after lock_timeout."""
    shared = tmp_path / "shared"
    shared.mkdir()
    keys = [f"k{i}" for i in range(20)]
    slow = launch(tmp_path, "n0", keys, str(shared), spec_env(tmp_path / "log", ttl=30, sleep=1.0))
    try:
        deadline = time.monotonic() + 120  # hang guard
        while not list(shared.glob("*/leases/*.json")):
            assert slow.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        from tests.support._cluster import vector

        with pytest.raises(tsc.StoreLockedError, match="held by another machine"):
            tsc.cached(keys, cache_dir=tmp_path / "n1", remote=str(shared), loader=vector,
                       loader_id="cluster.vec/1", identity="none", progress=False,
                       lock_timeout=0.5)
    finally:
        slow.proc.send_signal(signal.SIGKILL)
        slow.proc.wait(60)


def test_records_skips_and_merges_through_a_shared_directory(tmp_path: Path) -> None:
    """Records travel as any part does; calls alternating between two nodes add keys
    incrementally (each record computed once over both nodes), past 4 parts the holder merges
    them into one; with on_error="skip" a failing key is skipped by the call that built and
    retried by the next one, as without remote=."""
    from tests.support._cache_loaders import log_lines
    from tests.support._records import FIELDS, RecordLoader, expected, same, write_sources

    paths = write_sources(tmp_path / "src", 90)
    shared = tmp_path / "shared"
    shared.mkdir()
    log = tmp_path / "log"
    loader = RecordLoader(log)
    for step in range(6):
        want = paths[: 40 + step * 10]
        s = tsc.cached(want, loader=loader, loader_id="records/1", fields=FIELDS,
                       cache_dir=tmp_path / f"node{step % 2}", remote=str(shared), workers=1,
                       progress=False)
        assert all(same(s[p], expected(p)) for p in want)
        s.close()
    assert sorted(k for _pid, k in log_lines(log)) == sorted(paths), "each computed once"
    [ns] = [d for d in shared.iterdir() if d.name != ".tsc-probe"]
    history = [len(json.loads(m.read_text())["parts"]) for m in sorted(ns.glob("manifests/*"))]
    assert history == [1, 2, 3, 4, 5, 1, 2]  # merged into one past 4 parts
    # the node's pointers to parts no longer current go with gc; the current ones stay
    node = tmp_path / "node1"
    [local] = [d for d in node.iterdir() if d.name != "remote"]
    live = json.loads(sorted((local / "manifests").iterdir())[-1].read_text())["parts"]
    assert len(list((local / "parts").glob("*.remote"))) > len(live)
    removed = tsc.gc(node, grace=0)
    assert {r.reason for r in removed if r.path.endswith(".remote")} == {
        "pointer of a part no longer current"}
    assert sorted(p.name for p in (local / "parts").glob("*.remote")) == sorted(
        f"{part}.remote" for part in live)
    again = tsc.cached(paths, loader=loader, loader_id="records/1", fields=FIELDS,
                       cache_dir=node, remote=str(shared), workers=1, progress=False)
    assert all(same(again[p], expected(p)) for p in paths[::7])
    again.close()

    def flaky(p: str) -> np.ndarray:
        if p.endswith("bad"):
            raise ValueError("cannot read")
        return np.ones(2, np.float32)

    kw = {"loader": flaky, "loader_id": "flaky/1", "identity": "none", "remote": str(shared),
          "on_error": "skip", "progress": False, "workers": 1}
    first = tsc.cached(["a", "bad"], cache_dir=tmp_path / "node0", **kw)  # type: ignore[arg-type]
    assert len(first) == 1 and [k for k, _r in first.spec.skipped] == ["bad"]
    other = tsc.cached(["a", "b"], cache_dir=tmp_path / "node1", **kw)  # type: ignore[arg-type]
    assert len(other) == 2


def test_a_create_answered_after_the_client_timed_out_is_recognised(
    objects: S3Objects, s3: S3Process
) -> None:
    """The server applies a create and holds its answer until the client, past its read
    timeout, has sent it again: the retry is told 412 (the name is taken: by itself), the
    client reads the object back and finds its own token, so the create is ours, not a false
    "exists"."""
    patient = S3Objects(objects.url, {**s3.storage_options(),
                                      "config_kwargs": {"read_timeout": 1}})
    s3.inject([Fault("late", "late.json", "PUT", count=1, seconds=5.0)])
    assert patient.create("late.json", {"v": 1}, "mine") is True
    # a request is logged once its answer is sent: wait for both (the late one is let go when
    # the retry arrives, and may be logged after the client has its 412 and has read back)
    deadline = time.monotonic() + 120
    while len(statuses := [r.status for r in s3.requests("PUT", f"{BUCKET}/")]) < 2:
        assert time.monotonic() < deadline, f"the late PUT was never answered: {statuses}"
        time.sleep(0.05)
    assert sorted(statuses) == [200, 412]  # the late one, and the retry
    assert patient.read_json("late.json") == {"v": 1, "writer": "mine"}
    assert patient.create("late.json", {"v": 2}, "theirs") is False


def test_a_refused_read_names_the_listbucket_permission(s3: S3Process, tmp_path: Path) -> None:
    """Without s3:ListBucket, S3 answers 403 for an object that does not exist (the next
    manifest, read until absent): the call fails with a PermissionError that says so, names
    the object and computes nothing."""
    prefix = f"s3://{BUCKET}/listbucket"
    s3.inject([Fault("denied", "listbucket/", "GET", count=-1)])
    computed: list[str] = []

    def load(key: str) -> np.ndarray:
        computed.append(key)
        return np.zeros(2, np.float32)

    try:
        with pytest.raises(PermissionError, match="s3:ListBucket") as err:
            tsc.cached(["a", "b"], cache_dir=tmp_path / "node", remote=prefix,
                       storage_options=s3.storage_options(), loader=load, loader_id="t/1",
                       identity="none", progress=False, workers=1)
    finally:
        s3.inject([])
    assert f"{prefix}/" in str(err.value) and "403" in str(err.value)
    assert not computed


FROM_THE_ENVIRONMENT = """
import json, sys
import numpy as np
import tensorstore_cache as tsc
computed = []
def load(key):
    computed.append(key)
    return np.full(3, len(key), np.float32)
keys = ["a", "bb", "ccc"]
store = tsc.cached(keys, cache_dir=sys.argv[1], loader=load, loader_id="env/1",
                   identity="none", progress=False, workers=1)
assert store.take(store.rows(keys)).tolist() == [[1.0] * 3, [2.0] * 3, [3.0] * 3]
print(json.dumps({"computed": computed, "location": store.location}))
"""


def test_the_remote_and_its_store_from_the_environment(s3: S3Process, tmp_path: Path) -> None:
    """$TSC_REMOTE names an S3 prefix and fsspec's own FSSPEC_S3_* variables give the
    endpoint and the credentials: cached() without remote= or storage_options= shares the
    namespace through it (a second node computes nothing), and the location shown is the
    node's namespace directory, with no credential in it."""
    prefix = f"s3://{BUCKET}/from-env"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TSC_", "FSSPEC_", "AWS_"))}
    env.update({"TSC_REMOTE": prefix, "FSSPEC_S3_ENDPOINT_URL": s3.endpoint,
                "FSSPEC_S3_KEY": "testing", "FSSPEC_S3_SECRET": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "PYTHONPATH": str(REPO)})
    found = []
    for node in ("n0", "n1"):
        proc = subprocess.run([sys.executable, "-c", FROM_THE_ENVIRONMENT, str(tmp_path / node)],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        found.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert found[0]["computed"] == ["a", "bb", "ccc"] and found[1]["computed"] == []
    location = Path(found[1]["location"])
    assert location.parent == tmp_path / "n1" and "testing" not in str(location)
    assert s3.requests("PUT", f"{BUCKET}/from-env/")  # written there, through the environment


def test_the_bucket_policy_on_the_cluster_page_is_valid() -> None:
    """The bucket policy of docs/cluster.md parses, gives ListBucket and GetObject to every
    role that reads, PutObject to the build nodes only and DeleteObject to gc's role only,
    and denies writes to anyone else."""
    page = (REPO / "docs" / "cluster.md").read_text()
    block = page.split("### Who may write the prefix", 1)[1].split("```json\n", 1)[1]
    policy = json.loads(block.split("\n```", 1)[0])
    allowed: dict[str, set[str]] = {}
    for st in policy["Statement"]:
        if st["Effect"] == "Allow":
            who = st["Principal"]["AWS"]
            for role in [who] if isinstance(who, str) else who:
                allowed.setdefault(st["Action"], set()).add(role.rsplit("/", 1)[1])
    assert allowed == {"s3:ListBucket": {"train-nodes", "eval-jobs", "cache-admin"},
                       "s3:GetObject": {"train-nodes", "eval-jobs", "cache-admin"},
                       "s3:PutObject": {"train-nodes"}, "s3:DeleteObject": {"cache-admin"}}
    [deny] = [st for st in policy["Statement"] if st["Effect"] == "Deny"]
    assert deny["Principal"] == "*" and set(deny["Action"]) == {"s3:PutObject", "s3:DeleteObject"}
    spared = deny["Condition"]["ArnNotLike"]["aws:PrincipalArn"]
    assert {r.rsplit("/", 1)[1] for r in spared} == {"train-nodes", "cache-admin"}
