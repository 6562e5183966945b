"""Start rounds of agent processes (spawn context), synchronise them, measure memory.

A *round* is a list of jobs started together. Every agent first imports its libraries
and reports ``imported``; when all have, the driver says ``start`` to all at once, so
no agent's timed work overlaps another's interpreter start-up. Agents whose job holds
the column report ``ready``; when all have, the driver reads each process's USS and PSS
(``psutil.Process.memory_full_info``) at the same moment, then says ``go``.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import psutil

from benchmarks._agent import agent_main

ROUND_TIMEOUT_S = 1800.0
#: modules a forkserver imports once, so that its agents start in milliseconds
FORKSERVER_PRELOAD = ["numpy", "PIL.Image", "pandas", "torch", "torch.utils.data", "datasets",
                      "zarr", "tensorstore_cache", "benchmarks._agent", "benchmarks.methods"]
_START_METHOD = ["spawn"]


def set_start_method(name: str) -> None:
    """``"spawn"`` (default: every agent is a fresh interpreter, like a sweep agent) or
    ``"forkserver"`` (agents fork from a server that imported the libraries once: much
    faster to start, for smoke tests; library pages are then shared with the server)."""
    if name not in ("spawn", "forkserver"):
        raise ValueError(f"start method must be 'spawn' or 'forkserver', got {name!r}")
    if name == "forkserver":
        multiprocessing.get_context("forkserver").set_forkserver_preload(FORKSERVER_PRELOAD)
    _START_METHOD[0] = name


class AgentError(RuntimeError):
    """An agent process failed; the message holds its traceback."""


def memory_of(pid: int) -> dict[str, int]:
    """USS, PSS, RSS and anonymous memory of a live process, in bytes.

    USS counts every page mapped by this process only, file pages included: one
    process reading a memory-mapped file has those page-cache pages in its USS until a
    second process maps them too. ``anon`` (from ``/proc/PID/smaps_rollup``) counts only
    anonymous memory (heap, copies), which no other process can share.
    """
    info = psutil.Process(pid).memory_full_info()
    out = {"uss": int(info.uss), "pss": int(info.pss), "rss": int(info.rss)}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    out["anon"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def _recv(conn: Any, proc: Any, deadline: float, what: str) -> tuple[str, dict[str, Any]]:
    while not conn.poll(0.05):
        if not proc.is_alive() and not conn.poll(0.05):
            raise AgentError(f"agent pid {proc.pid} died (exit code {proc.exitcode}) before {what}")
        if time.monotonic() > deadline:
            raise AgentError(f"agent pid {proc.pid} timed out waiting for {what}")
    kind, payload = conn.recv()
    if kind == "error":
        raise AgentError(f"agent pid {proc.pid} failed:\n{payload.get('error')}")
    return kind, payload


def run_round(
    jobs: list[dict[str, Any]],
    server_pids: list[int] | None = None,
    timeout_s: float = ROUND_TIMEOUT_S,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Run ``jobs`` in parallel agent processes; return their results and memory.

    Returns ``(results, memory)``: ``results[i]`` is job ``i``'s result dict; ``memory``
    is ``None`` unless some job holds (``"hold"`` or ``"baseline"`` in its tasks), else
    ``{"agents": [per holding non-baseline job], "baseline": {...} or None,
    "servers": [...]}`` with ``uss``/``pss``/``rss`` bytes each.
    """
    ctx = multiprocessing.get_context(_START_METHOD[0])
    deadline = time.monotonic() + timeout_s
    procs: list[Any] = []
    conns: list[Any] = []
    try:
        for job in jobs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=agent_main, args=(job, child), daemon=False)
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        for conn, proc in zip(conns, procs, strict=True):
            _recv(conn, proc, deadline, "imports")
        for conn in conns:
            conn.send("start")
        holding = [i for i, job in enumerate(jobs) if {"hold", "baseline"} & set(job["tasks"])]
        memory = None
        if holding:
            for i in holding:
                _recv(conns[i], procs[i], deadline, "ready")
            memory = {"agents": [], "baseline": None, "servers": []}
            for i in holding:
                mem = memory_of(procs[i].pid)
                if "baseline" in jobs[i]["tasks"]:
                    memory["baseline"] = mem
                else:
                    memory["agents"].append(mem)
            memory["servers"] = [memory_of(pid) for pid in server_pids or []]
            for i in holding:
                conns[i].send("go")
        results = []
        for conn, proc in zip(conns, procs, strict=True):
            _kind, payload = _recv(conn, proc, deadline, "results")
            results.append(payload)
        for proc in procs:
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
        return results, memory
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in conns:
            conn.close()
