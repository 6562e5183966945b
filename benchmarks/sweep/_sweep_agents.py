"""K agent lanes, each running trials one after another, every trial a fresh ``python`` process.

This is what ``wandb agent`` does on one machine with K agents, or K Optuna workers that
start a new process per trial: a lane takes the next trial (the caller's iterator asks
the study), starts ``python -m benchmarks.sweep.sweep_trial SPEC`` in a session of its own,
waits for it, and hands the finished record back (the caller tells the study). K lanes
run at once; a lane starts its next trial as soon as its last one ends.

While trials run, the node's memory is sampled (:class:`benchmarks.sweep._node_memory.NodeMemory`
over the trial processes, their children and the method's helper processes). A trial that
dies is a result: :func:`trial_outcome` says how it ended (with
:mod:`benchmarks.common._failures`, as the main benchmark does), its process group is cleaned
up, and the lane goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks.common._failures import (
    KernelLog,
    classify,
    failure_text,
    oom_kill_count,
    signal_name,
)
from benchmarks.sweep._decode_meter import read_log
from benchmarks.sweep._node_memory import NodeMemory

REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.05


@dataclass
class Job:
    """One trial to run: its number, hyperparameters and spec; ``tell`` gets its record."""

    number: int
    params: dict[str, Any]
    spec: dict[str, Any]
    tell: Callable[[dict[str, Any]], None] | None = None


@dataclass
class _Running:
    job: Job
    lane: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    t_spawn: float
    oom_before: int | None
    pids: set[int] = field(default_factory=set)
    last_memory: int | None = None
    timed_out: bool = False


def _spawn(job: Job, lane: int, trial_dir: Path, env: dict[str, str]) -> _Running:
    stem = trial_dir / f"trial-{job.number:03d}"
    spec = dict(job.spec, number=job.number, params=job.params,
                result=str(stem) + ".result.json", decode_log=str(stem) + ".decode",
                log=str(stem) + ".log")
    job.spec = spec
    Path(str(stem) + ".spec.json").write_text(json.dumps(spec), encoding="utf-8")
    log = open(spec["log"], "wb")  # noqa: SIM115 (closed when the trial ends)
    oom_before = oom_kill_count()
    t_spawn = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.sweep.sweep_trial", str(stem) + ".spec.json"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    return _Running(job, lane, proc, log, t_spawn, oom_before, {proc.pid})


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def trial_outcome(
    rc: int | None, *, pids: set[int], kills: dict[int, dict[str, Any]], kernel_readable: bool,
    oom_count_rose: int | None, last_memory: int | None, error: str | None,
    timeout_s: float | None,
) -> dict[str, Any]:
    """How a trial ended, as a record (see :mod:`benchmarks.common._failures`).

    A trial is a tree of processes: the OOM killer may take one of its children (a
    build or ``map`` worker), after which the trial itself usually raises. A kill of any
    process of the tree that the kernel logged makes the trial "killed: out of memory",
    at the victim's anonymous memory as the kernel reported it; without a readable
    kernel log, a SIGKILL while the kernel's OOM kill count rose does, at the trial's
    last sampled memory (PSS of its tree).
    """
    if rc == 0 and error is None and timeout_s is None:
        return {"status": "ok", "cause": None, "text": "ok", "exitcode": 0}
    victims = sorted(pids & kills.keys())
    status, cause = classify(rc, error=error, timeout_s=timeout_s, oom_logged=bool(victims),
                             oom_count_rose=None if kernel_readable or oom_count_rose is None
                             else oom_count_rose > 0)
    if victims and timeout_s is None:  # a child killed for memory, the trial failing after it
        status, cause = "killed", "out of memory"
    memory = kills[victims[0]]["anon_rss"] if victims else last_memory
    record: dict[str, Any] = {
        "status": status, "cause": cause,
        "text": failure_text(status, cause, memory if status != "error" else None),
        "exitcode": rc, "signal": signal_name(-rc) if rc is not None and rc < 0 else None,
        "memory_bytes": memory, "last_memory_bytes": last_memory,
        "oom_victim": victims[0] if victims else None,
        "kernel_log": kills[victims[0]]["line"] if victims else
        ("read" if kernel_readable else "not readable"),
        "oom_count_rose": oom_count_rose,
    }
    if error:
        record["error"] = error
    return record


def _finish(run: _Running, rc: int, t0: float, kernel: KernelLog,
            timeout_s: float) -> dict[str, Any]:
    t_exit = time.time()
    run.log.close()
    _kill_group(run.proc.pid)  # what the trial left behind (pool workers of a killed trial)
    spec = run.job.spec
    try:
        result: dict[str, Any] = json.loads(Path(spec["result"]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        result = {}
    error = result.get("traceback") or result.get("error")
    if rc == 0 and error is None and "t_end" not in result:
        error = "the trial wrote no result"
    kills: dict[int, dict[str, Any]] = {}
    if rc != 0:
        kills = kernel.oom_kills()
        if rc == -signal.SIGKILL and kernel.readable and not run.pids & kills.keys():
            time.sleep(0.2)  # the kernel logs a kill as it sends it
            kills = kernel.oom_kills()
    after = oom_kill_count()
    rose = None if after is None or run.oom_before is None else after - run.oom_before
    failure = trial_outcome(rc, pids=run.pids, kills=kills, kernel_readable=kernel.readable,
                            oom_count_rose=rose, last_memory=run.last_memory, error=error,
                            timeout_s=timeout_s if run.timed_out else None)
    failure["elapsed_s"] = t_exit - run.t_spawn
    decode = read_log(spec["decode_log"])
    rec: dict[str, Any] = {
        "number": run.job.number, "lane": run.lane, "params": run.job.params, "pid": run.proc.pid,
        "status": failure["status"], "outcome": failure["text"], "failure": failure,
        "total_s": t_exit - run.t_spawn,
        "decode_calls": decode["calls"], "decode_cpu_s": decode["cpu_s"],
        "decode_pids": decode["pids"], "log": spec["log"],
    }
    if failure["status"] != "ok":
        rec["log_tail"] = _tail(spec["log"])
    # timestamps, in seconds since the sweep started
    rec["at_spawn"], rec["at_exit"] = run.t_spawn - t0, t_exit - t0
    for key in ("main", "imported", "table", "vectors", "first_batch", "trained", "end"):
        if isinstance(result.get(f"t_{key}"), (int, float)):
            rec[f"at_{key}"] = result[f"t_{key}"] - t0
    # durations
    spans = {"interpreter_s": ("spawn", "main"), "import_s": ("main", "imported"),
             "startup_s": ("spawn", "imported"), "data_s": ("imported", "first_batch"),
             "ttfb_s": ("spawn", "first_batch"), "table_read_s": ("imported", "table"),
             "vectors_s": ("table", "vectors"), "dataset_s": ("vectors", "first_batch"),
             "train_s": ("first_batch", "trained"), "eval_exit_s": ("trained", "exit")}
    for name, (a, b) in spans.items():
        if f"at_{a}" in rec and f"at_{b}" in rec:
            rec[name] = rec[f"at_{b}"] - rec[f"at_{a}"]
    if "data_s" in rec and rec["total_s"] > 0:
        rec["data_share"] = rec["data_s"] / rec["total_s"]
    for key in ("val_rmse", "test_pred_mean", "steps_done", "items_trained", "train_hit",
                "test_hit", "write_bytes", "cancelled_write_bytes", "read_bytes",
                "peak_rss_bytes", "train_rows", "test_rows", "val_rows", "error"):
        if key in result:
            rec[key] = result[key]
    return rec


def run_lanes(
    jobs: Iterator[Job],
    *,
    agents: int,
    trial_dir: Path,
    memory: NodeMemory,
    helpers: list[int] | None = None,
    env: dict[str, str] | None = None,
    period_s: float = 0.5,
    timeout_s: float = 3600.0,
    log: Callable[[str], None] = lambda msg: None,
) -> dict[str, Any]:
    """Run ``jobs`` on ``agents`` lanes; return the trials' records and memory samples.

    Returns ``{"wall_s", "trials": [record per trial, in the order they ended],
    "samples": [[seconds, node bytes, pss, cache resident, processes], ...], "peak":
    {the sample with the highest node memory}, "sampler_cpu_s": CPU time the sampling
    took in this process}``. A record's ``at_*`` are moments in seconds since the first
    trial started (``at_spawn``, ``at_main``: the trial's first line ran, ``at_imported``,
    ``at_table``: ratings tables read, ``at_vectors``: the method returned every vector,
    ``at_first_batch``, ``at_trained``, ``at_end``, ``at_exit``); its ``*_s`` are durations
    between them (``data_s``: from the imports' end to the first batch; ``ttfb_s``: from
    the process's start to the first batch).
    """
    trial_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env)
    kernel = KernelLog()  # the kernel's log from now on, read for OOM kills
    running: dict[int, _Running] = {}
    records: list[dict[str, Any]] = []
    samples: list[list[float]] = []
    peak: dict[str, Any] = {"node": 0}
    exhausted = False
    sampler_cpu = 0.0
    t0 = time.time()
    next_sample = 0.0
    while True:
        for lane in range(agents):
            if lane in running or exhausted:
                continue
            job = next(jobs, None)
            if job is None:
                exhausted = True
                break
            running[lane] = _spawn(job, lane, trial_dir, env)
            log(f"lane {lane}: trial {job.number} {job.params} (pid {running[lane].proc.pid})")
        if not running:
            break
        now = time.time()
        if now >= next_sample:
            cpu0 = time.thread_time()
            sample = memory.sample([r.proc.pid for r in running.values()], helpers or [])
            sampler_cpu += time.thread_time() - cpu0
            for r in running.values():
                tree = sample["per_root"].get(r.proc.pid)
                if tree and tree["pss"]:
                    r.pids.update(tree["pids"])
                    r.last_memory = tree["pss"]
            samples.append([now - t0, sample["node"], sample["pss"], sample["cache_resident"],
                            len(sample["pids"])])
            if sample["node"] > peak["node"]:
                peak = {k: v for k, v in sample.items() if k not in ("per_root", "pids")}
                peak["t_s"] = now - t0
                peak["processes"] = len(sample["pids"])
            next_sample = now + period_s
        for lane, r in list(running.items()):
            rc = r.proc.poll()
            if rc is None and time.time() - r.t_spawn > timeout_s:
                r.timed_out = True
                _kill_group(r.proc.pid)
                rc = r.proc.wait()
            if rc is None:
                continue
            rec = _finish(r, rc, t0, kernel, timeout_s)
            records.append(rec)
            del running[lane]
            if r.job.tell is not None:
                r.job.tell(rec)
            extra = "" if rec["status"] == "ok" else f" [{rec['outcome']}]"
            log(f"lane {lane}: trial {rec['number']} {rec['status']}: data "
                f"{rec.get('data_s', float('nan')):.2f} s, training "
                f"{rec.get('train_s', float('nan')):.2f} s, rmse {rec.get('val_rmse')}{extra}")
        time.sleep(POLL_S)
    kernel.close()
    wall = max((r["at_exit"] for r in records), default=0.0)
    return {"wall_s": wall, "trials": sorted(records, key=lambda r: r["number"]),
            "samples": samples, "peak": peak, "sampler_cpu_s": sampler_cpu}
