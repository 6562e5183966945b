"""First agents again, in interleaved rounds: every method's cold start, medians and spread.

A method's first agent (an agent that finds no cache and computes every vector) is measured
once by :func:`benchmarks.run._rounds.bench_method`, between that method's other rounds: a
slower moment of a shared machine falls on one method only. :func:`first_rounds` measures
it again ``R`` times for every method, round after round, each round taking the methods in
a rotated order (round ``r`` starts with method ``r`` of the list), each first agent on an
empty cache of its own (``prepare``, one agent that loads, ``teardown``). A method's
``first_agent_s`` becomes the median of its rounds (the single measurement is kept as
``first_agent_once_s``), with every round's time and the agent's CPU seconds (its own and
its reaped children's, the build's worker processes included) beside it.
"""

from __future__ import annotations

import shutil
import statistics
from typing import Any

from benchmarks.common import methods
from benchmarks.common._failures import driver_error
from benchmarks.common._interleave import apply_medians, order, spread, summary
from benchmarks.run._driver import AgentError, run_round
from benchmarks.run._rounds import Config, log

__all__ = ["apply", "first_rounds", "markdown", "order"]


def _one(name: str, cfg: Config, paths: list[str], paths_file: str) -> dict[str, Any]:
    """One first agent of ``name`` on an empty cache: its time and CPU, or its failure."""
    method = methods.get(name)
    workdir = cfg.workdir / "first-rounds" / name.replace(":", "-")
    try:
        state = method.prepare(workdir, paths)
        servers = method.server_pids(state)
    except Exception as exc:
        method.teardown()
        return driver_error("prepare", exc)
    job = {"method": name, "state": state, "paths_file": paths_file, "seed": cfg.seed,
           "budget_s": cfg.budget_s, "tasks": ["load"]}
    try:
        (res,), _ = run_round([job], servers, timeout_s=cfg.agent_timeout_s)
    except AgentError as exc:
        return exc.failure or {"status": "error", "text": f"error: {exc}"}
    finally:
        method.teardown()
        shutil.rmtree(workdir, ignore_errors=True)
    if res.get("hit"):
        return {"status": "error", "text": "error: the first agent found a cache"}
    return {"status": "ok", "s": res["load_s"], "cpu_s": res.get("load_cpu_s")}


def first_rounds(cfg: Config, names: list[str], paths: list[str],
                 paths_file: str) -> dict[str, Any]:
    """``cfg.first_rounds`` rounds of every method's first agent, interleaved.

    Returns ``{"rounds": R, "orders": [[method, ...] per round], "methods": {name: {"s":
    [seconds or None per round], "cpu_s": [...], "failures": [text, ...], "median_s",
    "min_s", "max_s", "cpu_median_s"}}}``; a round whose agent failed leaves None and
    its text under ``failures``.
    """
    out: dict[str, Any] = {"rounds": cfg.first_rounds, "orders": [],
                           "methods": {n: {"s": [], "cpu_s": [], "failures": []} for n in names}}
    for r in range(cfg.first_rounds):
        ordered = order(names, r)
        out["orders"].append(ordered)
        for name in ordered:
            got = _one(name, cfg, paths, paths_file)
            per = out["methods"][name]
            if got["status"] == "ok":
                per["s"].append(got["s"])
                per["cpu_s"].append(got["cpu_s"])
                log(f"{name}: first agent, round {r + 1}/{cfg.first_rounds}: {got['s']:.2f} s"
                    + (f" ({got['cpu_s']:.2f} s CPU)" if got["cpu_s"] is not None else ""))
            else:
                per["s"].append(None)
                per["cpu_s"].append(None)
                per["failures"].append(f"round {r + 1}: {got['text']}")
                log(f"{name}: first agent, round {r + 1}: {got['text']}")
    for per in out["methods"].values():
        cpu = [c for c in per["cpu_s"] if c is not None]
        per.update(summary(per["s"]))
        per["cpu_median_s"] = statistics.median(cpu) if cpu else None
    return out


def apply(results: dict[str, Any], rounds: dict[str, Any]) -> None:
    """Make each method's ``first_agent_s`` the median of its rounds (the single first agent
    measured with its other rounds kept as ``first_agent_once_s``)."""
    apply_medians(results, rounds, "first_agent_s", "first_agent_once_s", "median_s")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(rounds: dict[str, Any] | None, no_cache: str = "no_cache") -> list[str]:
    """The section of the rounds: each method's median, spread, rounds and CPU."""
    if not rounds or not rounds.get("methods"):
        return []
    per_method = rounds["methods"]
    base = per_method.get(no_cache, {}).get("s", [])
    lines = ["", f"## First agents, {rounds['rounds']} interleaved rounds", "",
             "Every method's first agent on an empty cache, round after round, each round in a "
             "rotated order (round 1: " + ", ".join(rounds["orders"][0] if rounds["orders"]
                                                    else []) + "); seconds, and the agent's "
             "CPU seconds (its own and its worker processes').", "",
             "| method | median s | min s | max s | spread | each round s | CPU s (median) "
             f"| {no_cache} / method, each round |",
             "|---|---:|---:|---:|---:|---|---:|---|"]
    for name, per in per_method.items():
        each = ", ".join(_s(s) for s in per["s"])
        ratios = ", ".join("-" if a is None or b is None or not b else f"{a / b:.2f}"
                           for a, b in zip(base, per["s"], strict=False))
        lines.append(f"| {name} | {_s(per.get('median_s'))} | {_s(per.get('min_s'))} "
                     f"| {_s(per.get('max_s'))} | {spread(per)} | {each} "
                     f"| {_s(per.get('cpu_median_s'))} | {ratios if base else '-'} |")
    for name, per in per_method.items():
        for text in per.get("failures", []):
            lines.append(f"- {name}, {text}")
    return lines
