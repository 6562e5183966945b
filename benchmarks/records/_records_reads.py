"""The reads again, in interleaved rounds: every method's read phase and its opens at every
store size; medians.

Each method's read phase runs once with its other phases (:func:`records.bench_method`),
between other methods' runs. :func:`read_rounds` runs it again, ``--read-rounds`` times,
for every method whose store was kept, round after round, each round in a rotated order
(:mod:`benchmarks.common._interleave`), each read in a fresh process of the method's
environment: a method's open, key map, records by key, padded batches and epoch become the
medians of its rounds (its single read kept as ``<figure>_once``), and every round's
records are checked against its first read's (the same digests and sums).

:func:`open_rounds` opens the synthetic stores of every size (open time versus N), every
method in a round, ``--open-rounds`` rounds, a fresh process each: a method's open time at
a size is the median of its rounds. Both are what the read targets compare
(:func:`benchmarks.records._records_report.targets`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.common._interleave import order, spread
from benchmarks.common._report import rate, seconds
from benchmarks.records._records_procs import Runner

__all__ = ["FIGURES", "apply", "markdown", "open_rounds", "read_rounds"]

#: what a read round measures: the figure, its format, and whether more is better
FIGURES: dict[str, tuple[Callable[[Any], str], bool]] = {
    "open_s": (seconds, False),
    "key_map_s": (seconds, False),
    "record_by_key_per_s": (rate, True),
    "batch_records_per_s": (rate, True),
    "epoch_s": (seconds, False),
}
#: what every read of the same store must give again
CHECKED = ("record_digest", "batch_digest", "epoch")


def _median(values: list[float | None]) -> float | None:
    ok = [v for v in values if v is not None]
    return statistics.median(ok) if ok else None


def read_rounds(runner: Runner, jobs: dict[str, dict[str, Any]], firsts: dict[str, Any],
                rounds: int, log: Callable[[str], None]) -> dict[str, Any]:
    """``rounds`` rounds of every method's read phase (``jobs``: its read job), interleaved;
    ``firsts``: each method's first read (its digests are what every round must give).

    Returns ``{"rounds": R, "orders": [...], "methods": {name: {figure: [value or None per
    round], "failures": [text, ...], "medians": {figure: median}}}}``.
    """
    names = list(jobs)
    out: dict[str, Any] = {"rounds": rounds, "orders": [],
                           "methods": {n: {**{f: [] for f in FIGURES}, "failures": []}
                                       for n in names}}
    for r in range(rounds):
        ordered = order(names, r)
        out["orders"].append(ordered)
        for name in ordered:
            res = runner.run(name, "read", jobs[name])
            per = out["methods"][name]
            changed = [k for k in CHECKED if res.get(k) != firsts[name].get(k)]
            if res["status"] != "ok" or changed:
                why = res.get("text", res["status"]) if res["status"] != "ok" else (
                    f"other records than its first read ({', '.join(changed)})")
                per["failures"].append(f"round {r + 1}: {why}")
                for f in FIGURES:
                    per[f].append(None)
                log(f"{name}: read, round {r + 1}: {why}")
                continue
            for f in FIGURES:
                per[f].append(res.get(f))
            log(f"{name}: read, round {r + 1}/{rounds}: open {seconds(res['open_s'])}, "
                f"by key {rate(res['record_by_key_per_s'])}/s, "
                f"batches {rate(res['batch_records_per_s'])}/s")
    for per in out["methods"].values():
        per["medians"] = {f: _median(per[f]) for f in FIGURES}
    return out


def apply(methods: dict[str, Any], rounds: dict[str, Any] | None) -> None:
    """Make each method's read figures the medians of its rounds (its single read kept as
    ``<figure>_once``)."""
    for name, per in (rounds or {}).get("methods", {}).items():
        rec = methods.get(name)
        if rec is None:
            continue
        for f, value in per["medians"].items():
            if value is not None:
                rec.setdefault(f"{f}_once", rec.get(f))
                rec[f] = value


def open_rounds(runner: Runner, jobs: dict[tuple[str, int], dict[str, Any]], rounds: int,
                log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """``rounds`` rounds of a fresh process's open (open + first record) of every store of
    ``jobs`` (by method and size), every method in each round at each size, in a rotated
    order.

    Returns ``{name: {str(n): {"status": "ok", "open_s": median, "open_s_all": [...]}}}``
    (a failed open: that store's failure record).
    """
    names = list(dict.fromkeys(name for name, _n in jobs))
    sizes = sorted({n for _name, n in jobs})
    times: dict[tuple[str, int], list[float | None]] = {key: [] for key in jobs}
    failed: dict[tuple[str, int], dict[str, Any]] = {}
    for r in range(rounds):
        for n in sizes:
            for name in order(names, r):
                key = (name, n)
                if key not in jobs or key in failed:
                    continue
                res = runner.run(name, "open", jobs[key])
                if res["status"] != "ok":
                    failed[key] = {k: v for k, v in res.items() if k != "log_tail"}
                    log(f"{name}: open at {n:,}, round {r + 1}: {res.get('text', res['status'])}")
                    continue
                times[key].append(res["open_s"])
        log(f"opens, round {r + 1}/{rounds} done")
    out: dict[str, dict[str, Any]] = {name: {} for name in names}
    for (name, n), got in times.items():
        out[name][str(n)] = failed.get((name, n)) or {
            "status": "ok", "open_s": _median(got), "open_s_all": got}
    return out


def markdown(rounds: dict[str, Any] | None) -> list[str]:
    """The section of the read rounds: each method's medians and their spreads."""
    if not rounds or not rounds.get("methods"):
        return []
    lines = ["", f"## Reads in {rounds['rounds']} interleaved rounds (medians; spread: "
             "(max - min) / median)", "",
             "| method | " + " | ".join(f"{f} | spread" for f in FIGURES) + " | failures |",
             "|---|" + "---:|---:|" * len(FIGURES) + "---|"]
    for name, per in rounds["methods"].items():
        cells = []
        for f, (fmt, _more) in FIGURES.items():
            ok = [v for v in per[f] if v is not None]
            cells += [fmt(per["medians"][f]), spread({
                "median_s": per["medians"][f], "min_s": min(ok, default=None),
                "max_s": max(ok, default=None)})]
        fails = "; ".join(per["failures"]).replace("|", "/") or "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {fails} |")
    return lines
