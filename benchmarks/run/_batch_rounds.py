"""Random batches again, in interleaved rounds: the methods the batch target compares.

A method's random batches of 256 are measured once by its later agent in
:func:`benchmarks.run._rounds.bench_method`, one method after the other: two one-second
rates taken minutes apart, on a shared machine, differ by more than the 5 % the target
allows. :func:`batch_rounds` builds each method's cache once (``prepare`` and a first agent,
not timed), then measures ``R`` rounds, each round taking the methods in a rotated order
(round ``r`` starts with method ``r``), each measurement a fresh later agent that loads,
makes a full pass (as the later agent does before its batches) and times the same batches.
A method's ``batch_items_per_s`` becomes the median of its rounds (the single measurement
is kept as ``batch_items_once_per_s``).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

from benchmarks.common import methods
from benchmarks.common._failures import driver_error
from benchmarks.common._interleave import apply_medians, order, spread, summary
from benchmarks.run._driver import AgentError, run_round
from benchmarks.run._rounds import Config, log

__all__ = ["METHODS", "apply", "batch_rounds", "markdown"]

#: The methods whose batches the target compares (``tensorstore_cache / raw_memmap``).
METHODS = ("tensorstore_cache", "raw_memmap")


def _agent(job: dict[str, Any], servers: list[int], cfg: Config, tasks: list[str]) -> dict[str, Any]:
    """One agent of ``job`` doing ``tasks``: its result, or its failure record."""
    try:
        (res,), _ = run_round([dict(job, tasks=tasks)], servers, timeout_s=cfg.agent_timeout_s)
    except AgentError as exc:
        return exc.failure or {"status": "error", "text": f"error: {exc}"}
    return {"status": "ok", **res}


@contextlib.contextmanager
def _caches(cfg: Config, names: list[str], paths: list[str],
            paths_file: str) -> Iterator[dict[str, Any]]:
    """Every method's cache, built once (a first agent), as ``name -> (job, servers)``, or
    the failure that left it out; torn down at the end."""
    ready: dict[str, Any] = {}
    try:
        for name in names:
            method = methods.get(name)
            workdir = cfg.workdir / "batch-rounds" / name.replace(":", "-")
            try:
                state = method.prepare(workdir, paths)
                servers = method.server_pids(state)
            except Exception as exc:
                ready[name] = driver_error("prepare", exc)
                continue
            job = {"method": name, "state": state, "paths_file": paths_file, "seed": cfg.seed,
                   "budget_s": cfg.budget_s}
            built = _agent(job, servers, cfg, ["load"])
            ready[name] = (job, servers) if built["status"] == "ok" else built
        yield ready
    finally:
        for name in names:
            methods.get(name).teardown()
            shutil.rmtree(cfg.workdir / "batch-rounds" / name.replace(":", "-"),
                          ignore_errors=True)


def batch_rounds(cfg: Config, names: list[str], paths: list[str],
                 paths_file: str) -> dict[str, Any]:
    """``cfg.batch_rounds`` rounds of the random batches of ``names``, interleaved.

    Returns ``{"rounds": R, "orders": [[method, ...] per round], "methods": {name:
    {"items_per_s": [rate or None per round], "failures": [text, ...],
    "median_items_per_s", "min_items_per_s", "max_items_per_s"}}}``.
    """
    out: dict[str, Any] = {"rounds": cfg.batch_rounds, "orders": [],
                           "methods": {n: {"items_per_s": [], "failures": []} for n in names}}
    with _caches(cfg, names, paths, paths_file) as ready:
        for r in range(cfg.batch_rounds):
            ordered = order(names, r)
            out["orders"].append(ordered)
            for name in ordered:
                per, cache = out["methods"][name], ready[name]
                got = (_agent(cache[0], cache[1], cfg, ["load", "full_pass", "batches"])
                       if isinstance(cache, tuple) else cache)
                if got["status"] == "ok":
                    per["items_per_s"].append(got["batches"]["items_per_s"])
                    per.setdefault("file_pmd_mapped_kib", []).append(
                        got["batches"].get("file_pmd_mapped_kib"))
                    per.setdefault("line_offset", []).append(got["batches"].get("line_offset"))
                    log(f"{name}: random batches, round {r + 1}/{cfg.batch_rounds}: "
                        f"{got['batches']['items_per_s']:,.0f} items/s")
                else:
                    per["items_per_s"].append(None)
                    per["failures"].append(f"round {r + 1}: {got['text']}")
                    log(f"{name}: random batches, round {r + 1}: {got['text']}")
    for per in out["methods"].values():
        per.update(summary(per["items_per_s"], "items_per_s"))
    return out


def apply(results: dict[str, Any], rounds: dict[str, Any]) -> None:
    """Make each method's ``batch_items_per_s`` the median of its rounds (the single
    measurement kept as ``batch_items_once_per_s``); a method whose own later agent failed
    keeps that failure as its figure."""
    apply_medians(results, rounds, "batch_items_per_s", "batch_items_once_per_s",
                  "median_items_per_s", own_round="1")


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e3:,.0f}k"


def markdown(rounds: dict[str, Any] | None) -> list[str]:
    """The section of the rounds: each method's median, spread and rounds, and the ratio of
    the first method's rate to the second's in every round."""
    if not rounds or not rounds.get("methods"):
        return []
    per_method = rounds["methods"]
    names = list(per_method)
    lines = ["", f"## Random batches of 256, {rounds['rounds']} interleaved rounds", "",
             "Each method's cache built once, then a fresh later agent per round that loads, "
             "makes a full pass and times the same random batches for the rate budget, each "
             "round in a rotated order (round 1: " + ", ".join(rounds["orders"][0] if
                                                            rounds["orders"] else []) + "); "
             "items/s. The table above and the target take the medians.", "",
             "| method | median items/s | min | max | spread | each round |",
             "|---|---:|---:|---:|---:|---|"]
    for name, per in per_method.items():
        med, lo, hi = (per.get(f"{k}_items_per_s") for k in ("median", "min", "max"))
        each = ", ".join(_rate(v) for v in per["items_per_s"])
        lines.append(f"| {name} | {_rate(med)} | {_rate(lo)} | {_rate(hi)} "
                     f"| {spread(per, 'items_per_s')} | {each} |")
    if len(names) == 2:
        a, b = (per_method[n]["items_per_s"] for n in names)
        each = ", ".join("-" if x is None or not y else f"{x / y:.3f}"
                         for x, y in zip(a, b, strict=False))
        lines += ["", f"{names[0]} / {names[1]}, each round: {each}."]
    huge = {name: per["file_pmd_mapped_kib"] for name, per in per_method.items()
            if any(v is not None for v in per.get("file_pmd_mapped_kib", []))}
    if huge:
        lines += ["", "Files mapped on huge pages during the batches (`FilePmdMapped` of the "
                  "agent, MiB), each round: " + "; ".join(
                      f"{name} " + ", ".join("-" if v is None else f"{v / 1024:.0f}" for v in vs)
                      for name, vs in huge.items()) + "."]
    lines += _offsets(per_method)
    for name, per in per_method.items():
        for text in per.get("failures", []):
            lines.append(f"- {name}, {text}")
    return lines


def _offsets(per_method: dict[str, Any]) -> list[str]:
    """The line of where each round's batches started, by method (none if unknown)."""
    offsets = {name: per["line_offset"] for name, per in per_method.items()
               if any(v is not None for v in per.get("line_offset", []))}
    if not offsets:
        return []
    return ["", "Where a batch's data starts, in bytes past a 64-byte cache line (a batch made "
            "after the timed ones), each round: " + "; ".join(
                f"{name} " + ", ".join("-" if v is None else str(v) for v in vs)
                for name, vs in offsets.items()) + "."]
