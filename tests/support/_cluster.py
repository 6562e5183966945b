"""Node agents of the cluster tests: ``python -m tests.support._cluster <spec.json>``.

An agent waits for its start file (so that every agent of a test calls at
once, imports done), calls ``tsc.cached(keys, cache_dir=<its node's cache>,
remote=...)`` with :func:`vector` as its loader, checks every vector it got
against :func:`vector`, and writes a JSON verdict. Given ``opened`` and ``go`` files, it
reads its first vector, creates ``opened`` and waits for ``go`` before reading the rest
(so a test can count the requests made before the first vector); given ``returned`` and
``go``, it creates ``returned`` once ``cached()`` returned and waits for ``go`` before reading
anything. The loader appends each key it computes to one log with ``O_APPEND`` (one ``write``
a key), so computations are counted over the whole cluster, a killed agent's included. Given
``dask`` (a scheduler's address), the agent builds on that Dask cluster
(``executor=client.get_executor()``); its loader is then :class:`LoggedVector`
(``loader="logged"``), which logs from wherever it runs.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

import tensorstore_cache as tsc

DIM = 8


def vector(key: str) -> np.ndarray:
    """The vector of ``key``: reproducible from the key alone; logged and slowed on demand."""
    log = os.environ.get("CLUSTER_LOG")
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{key}\n".encode())
        finally:
            os.close(fd)
    pause = float(os.environ.get("CLUSTER_LOADER_SLEEP") or 0)
    if pause:
        time.sleep(pause)
    return _value(key)


def _value(key: str) -> np.ndarray:
    return np.random.default_rng(xxhash.xxh64_intdigest(key.encode())).random(DIM, dtype=np.float32)


def file_vector(key: str) -> np.ndarray:
    """The vector of the file ``key``: made from its bytes; logged as ``<node> <key>``."""
    log = os.environ.get("CLUSTER_LOG")
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{os.environ.get('CLUSTER_NODE', '?')} {key}\n".encode())
        finally:
            os.close(fd)
    return _bytes_value(Path(key).read_bytes())


def _bytes_value(data: bytes) -> np.ndarray:
    return np.random.default_rng(xxhash.xxh64_intdigest(data)).random(DIM, dtype=np.float32)


def _count_content_reads() -> list[int]:
    """Count the source files read whole to compare their content hash (in this process)."""
    from tensorstore_cache.fs import sources

    reads = [0]
    original = sources.hash_file

    def counted(key: str) -> int:
        reads[0] += 1
        return original(key)

    sources.hash_file = counted
    return reads


def computed_by(log: Path) -> Counter[tuple[str, str]]:
    """How many times each ``(node, key)`` was computed by :func:`file_vector`."""
    if not log.exists():
        return Counter()
    pairs = (line.split(" ", 1) for line in log.read_text().splitlines() if line)
    return Counter((node, key) for node, key in pairs)


def computed(log: Path) -> Counter[str]:
    """How many times each key was computed, from the log."""
    if not log.exists():
        return Counter()
    return Counter(line for line in log.read_text().splitlines() if line)


def spec_env(log: Path, *, ttl: float | None = None, sleep: float = 0.0,
             extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of an agent process."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TSC_TEST_", "TSC_REMOTE", "CLUSTER_"))}
    env["CLUSTER_LOG"] = str(log)
    env["CLUSTER_LOADER_SLEEP"] = str(sleep)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    if ttl is not None:
        env["TSC_REMOTE_LEASE_TTL"] = str(ttl)
    env.update(extra or {})
    return env


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    keys: list[str] = spec["keys"]
    start = Path(spec["start"]) if spec.get("start") else None
    Path(spec["ready"]).touch()
    while start is not None and not start.exists():
        time.sleep(0.01)
    files = spec.get("loader") == "file"
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    reads = _count_content_reads()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = _cached(tsc, spec, keys, files)
    if spec.get("returned"):  # built or fetched, nothing read yet: say so, and wait to go on
        Path(spec["returned"]).touch()
        while not Path(spec["go"]).exists():
            time.sleep(0.01)
    if spec.get("opened"):  # the first vector read: say so, and wait to go on
        first = store.take(store.rows(keys[:1]))
        assert files or np.array_equal(first[0], _value(keys[0]))
        Path(spec["opened"]).touch()
        while not Path(spec["go"]).exists():
            time.sleep(0.01)
    got = store.take(store.rows(keys))
    if spec.get("loader") == "records" or spec.get("records"):  # each text field: its key
        assert [str(t) for t in got["key"]] == keys
        got = got["vec"]
    want = np.stack([_bytes_value(Path(k).read_bytes()) if files else _value(k) for k in keys])
    wrong = int(np.sum(np.any(got != want, axis=1)))
    return {"ok": True, "wrong": wrong, "n": len(store), "content_reads": reads[0],
            "warnings": [str(w.message) for w in caught], "location": store.location}


class LoggedVector:
    """:func:`vector` (or :func:`record`, with ``records``) as a loader object that carries
    its log, for builds whose tasks run in other processes than the agent (a Dask cluster's
    workers, which do not have the agent's environment): each key is logged as
    ``<pid> <key>``. With ``gate``, each call first waits until that file exists. Its
    item shape is declared (the fields of its records are, by :data:`LOGGED_FIELDS`), so the
    build's coordinator never computes a key: each is a shard task's."""

    def __init__(self, log: str, *, records: bool = False, gate: str | None = None) -> None:
        self.item_shape = None if records else (DIM,)
        self.log = log
        self.records = records
        self.gate = gate

    def __call__(self, key: str) -> Any:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{os.getpid()} {key}\n".encode())
        finally:
            os.close(fd)
        deadline = time.monotonic() + 120  # a hang guard, not a timing
        while self.gate is not None and not os.path.exists(self.gate):
            assert time.monotonic() < deadline, f"{self.gate} never appeared"
            time.sleep(0.01)
        return {"vec": _value(key), "key": key} if self.records else _value(key)


#: The fields of :class:`LoggedVector`'s records.
LOGGED_FIELDS = {"vec": tsc.Fixed((DIM,), "float32"), "key": tsc.Text()}


def record(key: str) -> dict[str, Any]:
    """A record of ``key``: its :func:`vector` and the key itself as text; logged."""
    return {"vec": vector(key), "key": key}


def _log_keys(keys: list[str]) -> None:
    log = os.environ.get("CLUSTER_LOG")
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, "".join(f"{k}\n" for k in keys).encode())
        finally:
            os.close(fd)


class VecBatch(tsc.BatchLoader):
    """The vectors of :func:`vector` a batch at a time, in a device worker; each key logged."""

    loader_id = "cluster.batch/1"
    item_shape = (DIM,)

    def __call__(self, items: list[Any]) -> np.ndarray:
        _log_keys([str(k) for k in items])
        return np.stack([_value(str(k)) for k in items])


def tokens(keys: list[str]) -> np.ndarray:
    """Version tokens of the keys (``identity=`` a function): the same on every node."""
    return np.array([xxhash.xxh64_intdigest(k.encode()) for k in keys], np.uint64)


def _cached(tsc: Any, spec: dict[str, Any], keys: list[str], files: bool) -> Any:
    kind = spec.get("loader", "vec")
    loader: Any = {"file": file_vector, "records": record}.get(kind, vector)
    if kind == "batch":
        loader = VecBatch(batch_size=4, devices=["cpu"])
    if kind == "logged":
        loader = LoggedVector(os.environ["CLUSTER_LOG"], records=bool(spec.get("records")),
                              gate=spec.get("gate"))
        kind = "logged-records" if spec.get("records") else "logged"
    client: Any = None
    if spec.get("dask"):  # a scheduler's address: build on that Dask cluster
        distributed: Any = importlib.import_module("distributed")  # untyped
        client = distributed.Client(spec["dask"], set_as_default=False)
    try:
        return tsc.cached(
            keys, cache_dir=spec["cache_dir"], remote=spec["remote"],
            storage_options=spec.get("storage_options"), loader=loader,
            loader_id=None if kind == "batch" else f"cluster.{kind}/1",
            identity=tokens if spec.get("identity") == "token"
            else spec.get("identity", "stat" if files else "none"),
            workers=spec.get("workers", 1), progress=False,
            on_error=spec.get("on_error", "raise"), lock_timeout=spec.get("lock_timeout"),
            executor=client.get_executor() if client is not None else None,
            fields=LOGGED_FIELDS if kind == "logged-records" else None,
        )
    finally:
        if client is not None:
            client.close()


@dataclass
class Agent:
    """One agent process of a node."""

    proc: subprocess.Popen[bytes]
    ready: Path
    verdict: Path

    def wait_ready(self, timeout: float = 120) -> None:
        """Wait until the agent has imported everything (hang guard: ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"agent did not start: {self.proc.returncode}")
            time.sleep(0.02)

    def result(self, timeout: float = 240) -> dict[str, Any]:
        """Its verdict once it exits (hang guard: ``timeout``)."""
        code = self.proc.wait(timeout)
        if not self.verdict.exists():
            return {"ok": False, "error": f"exit {code}", "returncode": code}
        return dict(json.loads(self.verdict.read_text()), returncode=code)


_launched = 0


def launch(
    work: Path, node: str, keys: list[str], remote: str, env: dict[str, str], *,
    storage_options: dict[str, Any] | None = None, start: Path | None = None,
    **options: Any,
) -> Agent:
    """Start an agent of node ``node`` (its cache is ``work/<node>``)."""
    global _launched
    _launched += 1
    name = f"{node}-{_launched}"
    spec = {"keys": keys, "cache_dir": str(work / node), "remote": remote,
            "storage_options": storage_options, "start": str(start) if start else None,
            "ready": str(work / f"{name}.ready"), "verdict": str(work / f"{name}.json"),
            **options}
    path = work / f"{name}.spec.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, "-m", "tests.support._cluster", str(path)],
                            env=env, cwd=env["PYTHONPATH"])
    return Agent(proc, Path(spec["ready"]), Path(spec["verdict"]))


def main() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if our parent ignores it
    spec = json.loads(Path(sys.argv[1]).read_text())
    try:
        verdict = _run(spec)
    except BaseException as exc:  # the verdict says what failed
        verdict = {"ok": False, "error": type(exc).__name__, "message": str(exc),
                   "traceback": traceback.format_exc()}
    Path(spec["verdict"]).write_text(json.dumps(verdict))


if __name__ == "__main__":
    main()
