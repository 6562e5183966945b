"""A cluster soak: 3 nodes x 2 agents against the test S3 server, with a killer, for minutes.

``python -m tests.support.cluster_soak --minutes 5`` runs rounds until the time is up. Each
round adds new keys; every agent of every node calls ``cached(keys, remote=...)`` at once
while the killer, at a random moment, takes out the process named by the newest lease
(SIGKILL, or SIGSTOP past the lease then SIGCONT), and some rounds the server loses
responses, answers 409 and 503 and stalls. Every surviving agent checks every vector. At
the end it prints the totals: wrong vectors, keys computed three times or more (both must
be 0), keys computed twice, kills, pauses. Exit status 1 if either is not 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common.s3server import Fault, S3Process
from tests.support._cluster import Agent, computed, launch, spec_env

BUCKET = "soak"
TTL = 2.0


def _holder_pid(fs: Any, root: str) -> int | None:
    """The pid the newest lease names, if any."""
    leases = sorted(fs.glob(f"{root}/*/leases/*.json"))
    if not leases:
        return None
    try:
        doc = json.loads(fs.cat_file(leases[-1]))
    except (OSError, ValueError):
        return None
    return int(doc["pid"]) if doc.get("state") == "held" else None


def _killer(fs: Any, root: str, agents: list[Agent], stop: threading.Event,
            tally: Counter[str]) -> None:
    ours = {a.proc.pid for a in agents}
    stop.wait(random.uniform(0.5, 4.0))
    pid = _holder_pid(fs, root)
    if stop.is_set() or pid not in ours:
        return
    assert pid is not None
    if random.random() < 0.7:
        os.kill(pid, signal.SIGKILL)
        tally["killed"] += 1
    else:
        os.kill(pid, signal.SIGSTOP)
        tally["paused"] += 1
        time.sleep(TTL * 2)
        os.kill(pid, signal.SIGCONT)


def _faults(server: S3Process, rnd: int) -> None:
    if rnd % 3 != 2:
        server.inject([])
        return
    server.inject([Fault("lost", "/manifests/", "PUT", count=1),
                   Fault("conflict", "/leases/", "PUT", count=1),
                   Fault("slowdown", "/manifests/", "GET", count=4),
                   Fault("stall", "/head.json", "GET", count=1, seconds=1.0)])


def _round(server: S3Process, fs: Any, work: Path, rnd: int, keys: list[str],
           tally: Counter[str]) -> list[dict[str, Any]]:
    env = spec_env(work / "log", ttl=TTL, sleep=0.02)
    start = work / f"start-{rnd}"
    agents = [launch(work, f"n{n}", keys, f"s3://{BUCKET}/soak", env,
                     storage_options=server.storage_options(), start=start)
              for n in range(3) for _ in range(2)]
    for agent in agents:
        agent.wait_ready()
    _faults(server, rnd)
    stop = threading.Event()
    killer = threading.Thread(target=_killer, args=(fs, f"{BUCKET}/soak", agents, stop, tally))
    killer.start()
    start.touch()
    results = [a.result(timeout=600) for a in agents]
    stop.set()
    killer.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--new-keys", type=int, default=40, help="new keys per round")
    args = parser.parse_args()
    import fsspec

    server = S3Process()
    server.create_bucket(BUCKET)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False,
                           **server.storage_options())
    tally: Counter[str] = Counter()
    wrong = failed = 0
    keys: list[str] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rnd = 0
        try:
            while time.monotonic() - began < args.minutes * 60:
                keys += [f"soak/{rnd:04d}/{i:03d}" for i in range(args.new_keys)]
                for r in _round(server, fs, work, rnd, keys, tally):
                    if r.get("ok"):
                        wrong += r["wrong"]
                    elif r.get("returncode") not in (-signal.SIGKILL,):
                        failed += 1
                        print("agent failed:", r.get("error"), r.get("message"), flush=True)
                rnd += 1
        finally:
            server.stop()
        counts = computed(work / "log")
    thrice = sum(1 for c in counts.values() if c >= 3)
    report = {"rounds": rnd, "keys": len(keys), "computed": sum(counts.values()),
              "keys_computed_twice": sum(1 for c in counts.values() if c == 2),
              "keys_computed_three_times_or_more": thrice, "never_computed":
              len(set(keys) - set(counts)), "wrong_vectors": wrong, "failed_agents": failed,
              "killed": tally["killed"], "paused": tally["paused"],
              "seconds": round(time.monotonic() - began, 1)}
    print(json.dumps(report, indent=1))
    raise SystemExit(1 if wrong or thrice or failed else 0)


if __name__ == "__main__":
    main()
