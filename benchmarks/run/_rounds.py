"""The rounds of one method: first agent, then K agents holding the column, each a result.

:func:`bench_method` runs a method's rounds (:func:`benchmarks.run._driver.run_round`) and
records every round's outcome under ``rounds``: ``{"status": "ok", ...}``, or the failure
record of an agent that was killed, raised or timed out (:mod:`benchmarks.common._failures`),
or ``"skipped"``. A failed round leaves its figures out; the run goes on. Before a
round of K > 1 agents, :func:`guard_round` estimates its memory from the 1-agent
round's (:func:`benchmarks.common._memory.estimate_round`) and skips it where it cannot fit,
unless OOM kills are allowed.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import methods
from benchmarks.common._failures import driver_error, skipped
from benchmarks.common._memory import available_memory, estimate_round, guard
from benchmarks.common._report import round_name
from benchmarks.common.methods._base import SyntheticLoader
from benchmarks.common.methods.torch_save import UNSAFE_NOTE
from benchmarks.run._driver import AGENT_TIMEOUT_S, AgentError, run_round

REPEAT_BELOW_S = 0.5  # open-time runs shorter than this are repeated (median)


@dataclass
class Config:
    images: int
    seed: int
    workdir: Path
    data: Path
    results: Path
    methods: list[str]
    agents: list[int]
    open_sizes: list[int]
    budget_s: float
    quick: bool
    start_method: str
    open_repeats: int
    out: str = "latest"
    resume: bool = False
    agent_timeout_s: float = AGENT_TIMEOUT_S
    allow_oom: bool = False
    first_rounds: int = 5
    batch_rounds: int = 5
    verify_rows: list[int] = field(default_factory=list)


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_paths(paths: list[str], file: Path) -> str:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text("\n".join(paths), encoding="utf-8")
    return str(file)


def _mem_summary(mem: dict[str, Any]) -> dict[str, Any]:
    agents, base, servers = mem["agents"], mem["baseline"], mem["servers"]
    out: dict[str, Any] = {
        "agents_uss_bytes": [a["uss"] for a in agents],
        "agents_pss_bytes": [a["pss"] for a in agents],
        "baseline_uss_bytes": base["uss"] if base else None,
        "baseline_pss_bytes": base["pss"] if base else None,
        "servers_uss_bytes": [s["uss"] for s in servers],
        "servers_pss_bytes": [s["pss"] for s in servers],
    }
    server_uss = sum(s["uss"] for s in servers)
    server_pss = sum(s["pss"] for s in servers)
    out["uss_total_bytes"] = sum(a["uss"] for a in agents) + server_uss
    out["pss_total_bytes"] = sum(a["pss"] for a in agents) + server_pss
    if all("anon" in m for m in [*agents, *servers]):
        out["agents_anon_bytes"] = [a["anon"] for a in agents]
        if base and "anon" in base:
            out["anon_growth_bytes"] = (sum(a["anon"] - base["anon"] for a in agents)
                                        + sum(s["anon"] for s in servers))
    if base:
        out["uss_growth_bytes"] = sum(a["uss"] - base["uss"] for a in agents) + server_uss
        out["pss_growth_bytes"] = sum(a["pss"] - base["pss"] for a in agents) + server_pss
    return out


def _round(cfg: Config, name: str, key: str, jobs: list[dict[str, Any]], servers: list[int],
           rounds: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None] | None:
    """Run one round; record its outcome in ``rounds[key]``; None if it failed."""
    t0 = time.monotonic()
    try:
        limit = methods.get(name).agent_timeout_s or cfg.agent_timeout_s
        results, mem = run_round(jobs, servers, timeout_s=limit)
    except AgentError as exc:
        failure = exc.failure or {"status": "error", "cause": str(exc), "text": f"error: {exc}"}
        rounds[key] = failure
        log(f"{name}: {round_name(key)}: {failure['text']}")
        for line in failure.get("evidence", []):
            log(f"  {line}")
        if failure.get("error"):
            log("  " + failure["error"].strip().replace("\n", "\n  "))
        return None
    rounds[key] = {
        "status": "ok", "elapsed_s": round(time.monotonic() - t0, 3),
        "peak_memory": [r.get("peak_memory") for r in results],
        "oom_score_adj": [r.get("oom_score_adj") for r in results],
    }
    return results, mem


def _one_agent_bytes(one: dict[str, Any]) -> tuple[int, int] | None:
    """Peak anonymous (else resident) bytes of the 1-agent round's agent and baseline."""
    def figure(mem: dict[str, Any] | None) -> int | None:
        if not mem:
            return None
        value = mem.get("anon", mem.get("rss"))
        return int(value) if value is not None else None

    if one["status"] == "ok":
        peaks = [figure(p) for p in one.get("peak_memory", [])]
        if len(peaks) < 2 or peaks[0] is None:
            return None
        return peaks[0], peaks[-1] or 0
    agent = figure(one.get("peak_memory")) or figure(one.get("last_memory"))
    if agent is None:
        return None
    base = [figure(o.get("last_memory")) for o in one.get("others", [])
            if o.get("role") == "baseline"]
    return agent, (base[0] or 0) if base else 0


def guard_round(cfg: Config, rounds: dict[str, Any], k: int) -> dict[str, Any]:
    """Whether the round of ``k`` agents may run, from the 1-agent round's memory.

    Returns ``{"run": bool, ...}``: with ``"record"`` (the skipped round's record) when
    it may not, and ``"guard"`` (the estimate) when there was one.
    """
    one = rounds.get("1")
    if one is None or one["status"] == "skipped":
        return {"run": False, "record": skipped("the 1-agent round did not run")}
    if one["status"] != "ok" and one.get("cause") != "out of memory":
        return {"run": False, "record": skipped(f"the 1-agent round failed ({one['text']})")}
    sizes = _one_agent_bytes(one)
    if sizes is None:
        return {"run": True}  # nothing sampled (not Linux): no estimate to guard with
    need = estimate_round(sizes[0], sizes[1], k)
    available, source = available_memory()
    decision = guard(need, available, allow_oom=cfg.allow_oom)
    record = {"need_bytes": need, "available_bytes": available, "available_from": source,
              "agent_bytes": sizes[0], "baseline_bytes": sizes[1], "text": decision.text}
    if decision.run:
        return {"run": True, "guard": record}
    return {"run": False, "guard": record,
            "record": skipped(decision.text.removeprefix("skipped: "), guard=record)}


def bench_method(name: str, cfg: Config, paths: list[str], paths_file: str) -> dict[str, Any]:
    """Every round of one method; a round that fails is recorded, not raised."""
    method = methods.get(name)
    rec: dict[str, Any] = {"summary": method.summary, "rounds": {}, "memory": {}}
    rounds: dict[str, Any] = rec["rounds"]
    workdir = cfg.workdir / "methods" / name.replace(":", "-")
    vdir = cfg.workdir / "verify"
    vdir.mkdir(parents=True, exist_ok=True)
    for stage in ("first", "later"):
        (vdir / f"{name}-{stage}.npy").unlink(missing_ok=True)
    try:
        state = method.prepare(workdir, paths)
        servers = method.server_pids(state)
    except Exception as exc:
        rounds["first"] = driver_error("prepare", exc)
        log(f"{name}: preparing failed: {rounds['first']['text']}")
        method.teardown()
        return rec
    job = {"method": name, "state": state, "paths_file": paths_file, "seed": cfg.seed,
           "budget_s": cfg.budget_s, "verify_rows": cfg.verify_rows}
    if name == "torch_save":
        log(UNSAFE_NOTE)
    try:
        log(f"{name}: first agent")
        done = _round(cfg, name, "first", [dict(job, tasks=["load", "verify"],
                                                verify_file=str(vdir / f"{name}-first.npy"))],
                      servers, rounds)
        if done is not None:
            (first,), _ = done
            rec["first_agent_s"] = first["load_s"]
            rec["first_agent_hit"] = first["hit"]
            rec["disk_bytes"] = method.disk_bytes(state)
        for k in cfg.agents:
            key = str(k)
            if done is None:
                rounds[key] = skipped("the first agent failed")
                continue
            verdict: dict[str, Any] = {}
            if k > 1:
                verdict = guard_round(cfg, rounds, k)
                if not verdict["run"]:
                    rounds[key] = verdict["record"]
                    log(f"{name}: {k} agents: {rounds[key]['text']}")
                    continue
                if "guard" in verdict:
                    log(f"{name}: {k} agents: {verdict['guard']['text']}")
            log(f"{name}: {k} agent(s) with the cache in place, and a baseline")
            jobs = [dict(job, tasks=["load", "full_pass", "hold"]) for _ in range(k)]
            if k == 1:
                jobs[0]["tasks"] = ["load", "full_pass", "hold", "verify", "lookups", "batches",
                                    "dataloader"]
                jobs[0]["verify_file"] = str(vdir / f"{name}-later.npy")
            jobs.append(dict(job, tasks=["baseline"]))
            ran = _round(cfg, name, key, jobs, servers, rounds)
            if "guard" in verdict:
                rounds[key]["guard"] = verdict["guard"]
            if ran is None:
                continue
            results, mem = ran
            assert mem is not None
            summary = _mem_summary(mem)
            summary["load_s"] = [r["load_s"] for r in results[:k]]
            rec["memory"][key] = summary
            if k == 1:
                later = results[0]
                rec["later_agent_s"] = later["load_s"]
                rec["later_agent_hit"] = later["hit"]
                rec["open_s"] = later["open_s"]
                rec["full_pass_s"] = later["full_pass_s"]
                rec["lookup_items_per_s"] = later["lookups"]["per_s"]
                rec["lookup_calls"] = later["lookups"]["calls"]
                rec["batch_items_per_s"] = later["batches"]["items_per_s"]
                rec["batch_calls"] = later["batches"]["calls"]
                rec["dataloader_epoch_s"] = later["dataloader"]["seconds"]
                rec["dataloader_items"] = later["dataloader"]["items"]
                rec["agent_import_s"] = later["import_s"]
        top = rec["memory"].get("4", {})
        for figure in ("uss_total_bytes", "pss_total_bytes", "uss_growth_bytes",
                       "anon_growth_bytes"):
            rec[f"{figure}_4_agents"] = top.get(figure)
    finally:
        method.teardown()
        shutil.rmtree(workdir, ignore_errors=True)  # measured: free the disk for the next
    return rec


def bench_open_vs_n(name: str, cfg: Config) -> dict[str, Any]:
    """Open/load time of a later agent at each size, on stores of random vectors.

    A size whose store cannot be written, or whose agent fails, holds the failure's
    record (``status``, ``text``...) instead of figures.
    """
    method = methods.get(name)
    out: dict[str, Any] = {}
    for n in cfg.open_sizes:
        root = cfg.workdir / "open" / name.replace(":", "-") / str(n)
        paths = [f"{cfg.workdir}/synthetic/{i // 1000:04d}/{i:08d}.jpg" for i in range(n)]
        paths_file = write_paths(paths, cfg.workdir / "open" / f"paths-{n}.txt")
        try:
            state = method.prepare(root, paths)
            t0 = time.perf_counter()
            column = method.load(state, paths, SyntheticLoader())
            column.close()
            write_s = time.perf_counter() - t0
            del column
            gc.collect()
        except Exception as exc:
            out[str(n)] = driver_error(f"writing {n} random vectors", exc)
            log(f"{name}: n={n}: {out[str(n)]['text']}")
            method.teardown()
            shutil.rmtree(root, ignore_errors=True)
            continue
        try:
            runs = []
            for _ in range(cfg.open_repeats):  # each in a fresh agent process
                (res,), _ = run_round([{"method": name, "state": state, "paths_file": paths_file,
                                        "tasks": ["load"], "synthetic": True}],
                                      timeout_s=cfg.agent_timeout_s)
                runs.append(res)
                if res["load_s"] > REPEAT_BELOW_S:
                    break  # seconds-long loads need no median against scheduling noise
            opens = [r["open_s"] for r in runs]
            loads = [r["load_s"] for r in runs]
            out[str(n)] = {
                "open_s": statistics.median(opens) if None not in opens else None,
                "load_s": statistics.median(loads),
                "open_s_runs": opens, "load_s_runs": loads,
                "hit": all(r["hit"] for r in runs), "write_s": write_s,
                "disk_bytes": method.disk_bytes(state),
            }
            log(f"{name}: n={n}: open {_fmt(out[str(n)]['open_s'])}, "
                f"hold column {_fmt(out[str(n)]['load_s'])} (median of {len(runs)} agents)")
        except AgentError as exc:
            out[str(n)] = exc.failure or {"status": "error", "text": f"error: {exc}"}
            log(f"{name}: n={n}: {out[str(n)]['text']}")
        finally:
            method.teardown()
            shutil.rmtree(root, ignore_errors=True)
    return out


def check_vectors(cfg: Config, name: str) -> bool | None:
    """Whether the method's first and later agents gathered what no_cache's first agent
    decoded; None if a reference or a sample is missing (its round failed)."""
    vdir = cfg.workdir / "verify"
    files = [vdir / "no_cache-first.npy", vdir / f"{name}-first.npy", vdir / f"{name}-later.npy"]
    if not all(f.exists() for f in files):
        return None
    ref = np.load(files[0])
    return all(np.array_equal(np.load(f), ref) for f in files[1:])


