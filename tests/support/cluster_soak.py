"""A cluster soak: 3 nodes x 2 agents against the test S3 server, with a killer, for minutes.

``python -m tests.support.cluster_soak --minutes 5 [--json FILE]`` runs rounds until the time
is up (or ``--rounds N`` rounds; ``--nodes`` and ``--agents`` change the cluster's shape). Each round adds new keys; every agent of every node calls
``cached(keys, remote=...)`` at once while the killer waits for a lease held by one of the
round's agents and takes its holder out: SIGKILL in the first round and in 7 rounds of 10
after it, else SIGSTOP for two lease times then SIGCONT. Every third round the server also
loses responses, answers 409 and 503 and stalls. Every surviving agent checks every vector.
At the end it prints (and with ``--json`` writes) its report, stamped with the commit, the
command, the machine and the date: wrong vectors, keys computed three times or more, keys
never computed and failed agents (each must be 0), holders killed (at least 1: a soak that
killed nothing proved nothing), pauses, keys computed twice. Exit status 1 if any of these
fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common._report import environment
from benchmarks.common._stamp import run_stamp
from benchmarks.common.s3server import Fault, S3Process
from tests.support._cluster import Agent, computed, launch, spec_env

BUCKET = "soak"
TTL = 2.0
#: How often the killer looks for a held lease (seconds).
LOOK_S = 0.05


def _holder_pid(fs: Any, root: str) -> int | None:
    """The pid the newest lease names while it is held, if any."""
    fs.invalidate_cache()
    leases = sorted(fs.glob(f"{root}/*/leases/*.json"))
    if not leases:
        return None
    try:
        doc = json.loads(fs.cat_file(leases[-1]))
    except (OSError, ValueError):
        return None
    return int(doc["pid"]) if doc.get("state") == "held" else None


def _killer(fs: Any, root: str, agents: list[Agent], stop: threading.Event, kill: bool,
            tally: Counter[str]) -> None:
    """Wait for a lease held by one of ``agents``, then kill (or pause) its holder."""
    ours = {a.proc.pid for a in agents}
    while not stop.wait(LOOK_S):
        pid = _holder_pid(fs, root)
        if pid in ours:
            break
    else:
        return
    assert pid is not None
    stop.wait(random.uniform(0.0, 0.5))  # before its first shard, mid-build, uploading...
    if kill:
        os.kill(pid, signal.SIGKILL)
        tally["killed"] += 1
        return
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
           tally: Counter[str], shape: tuple[int, int]) -> list[dict[str, Any]]:
    env = spec_env(work / "log", ttl=TTL, sleep=0.02)
    start = work / f"start-{rnd}"
    agents = [launch(work, f"n{n}", keys, f"s3://{BUCKET}/soak", env,
                     storage_options=server.storage_options(), start=start)
              for n in range(shape[0]) for _ in range(shape[1])]
    for agent in agents:
        agent.wait_ready()
    _faults(server, rnd)
    stop = threading.Event()
    kill = rnd == 0 or random.random() < 0.7
    killer = threading.Thread(target=_killer,
                              args=(fs, f"{BUCKET}/soak", agents, stop, kill, tally))
    killer.start()
    start.touch()
    results = [a.result(timeout=600) for a in agents]
    stop.set()
    killer.join()
    return results


def failures(report: dict[str, Any]) -> list[str]:
    """What in ``report`` fails the soak (empty: it held)."""
    out = [f"{report[name]} {name.replace('_', ' ')}" for name in
           ("wrong_vectors", "keys_computed_three_times_or_more", "never_computed",
            "failed_agents") if report[name]]
    if report["killed"] < 1:
        out.append("no lease holder was killed: the soak proved nothing")
    return out


def _soak(args: argparse.Namespace, tally: Counter[str]) -> dict[str, Any]:
    import fsspec

    server = S3Process()
    server.create_bucket(BUCKET)
    fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False,
                           **server.storage_options())
    wrong = failed = rnd = 0
    keys: list[str] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            while (time.monotonic() - began < args.minutes * 60 if args.rounds is None
                   else rnd < args.rounds):
                keys += [f"soak/{rnd:04d}/{i:03d}" for i in range(args.new_keys)]
                for r in _round(server, fs, work, rnd, keys, tally, (args.nodes, args.agents)):
                    if r.get("ok"):
                        wrong += r["wrong"]
                    elif r.get("returncode") != -signal.SIGKILL:
                        failed += 1
                        print("agent failed:", r.get("error"), r.get("message"), flush=True)
                rnd += 1
        finally:
            server.stop()
        counts = computed(work / "log")
    return {"nodes": args.nodes, "agents_per_node": args.agents, "rounds": rnd, "keys": len(keys), "computed": sum(counts.values()),
            "keys_computed_twice": sum(1 for c in counts.values() if c == 2),
            "keys_computed_three_times_or_more": sum(1 for c in counts.values() if c >= 3),
            "never_computed": len(set(keys) - set(counts)), "wrong_vectors": wrong,
            "failed_agents": failed, "killed": tally["killed"], "paused": tally["paused"],
            "seconds": round(time.monotonic() - began, 1)}


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print (and write) its stamped report; 1 if it failed."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.cluster_soak",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=None, help="this many rounds instead")
    parser.add_argument("--new-keys", type=int, default=40, help="new keys per round")
    parser.add_argument("--nodes", type=int, default=3, help="node cache directories")
    parser.add_argument("--agents", type=int, default=2, help="agent processes per node")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    env = environment()
    stamp = run_stamp("tests.support.cluster_soak", argv, env)
    report = {**_soak(args, Counter()), "loadavg_at_start": env.get("loadavg_at_start"),
              "stamp": stamp}
    report["failures"] = failures(report)
    text = json.dumps(report, indent=1)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(text)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
