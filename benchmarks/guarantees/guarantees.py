"""The figures the guarantees page quotes, measured: stopping a build, sharing a store.

Run ``python -m benchmarks.guarantees [--rounds 5] [--delay 0.9] [--out NAME]`` (a few
minutes on two cores). It writes ``benchmarks/results/guarantees/guarantees.json`` and its
table, ``guarantees.md``, stamped with the run (:mod:`benchmarks.common._stamp`):

- **stopping a build** (:mod:`.interrupts`): a build with ``workers=2`` whose loader takes
  ``--delay`` seconds a call is stopped, once its process and its worker both compute, by
  Ctrl-C (SIGINT to its process group), by SIGTERM and SIGKILL to the building process, and
  by SIGKILL to its pool worker; the seconds until the script handles it and until every
  process of the build is gone, ``--rounds`` times each, interleaved;
- **sharing a store** (:mod:`.sharing`): the USS growth of 4 processes (spawn, then fork)
  reading every vector of a 94 MiB store through views, against 4 that copy it, and what
  a fresh process reading one vector holds of the store.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common._record import add_results_options
from benchmarks.common._report import compile_sources, environment, publish
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import run_stamp
from benchmarks.guarantees import interrupts, sharing

MIB = 1 << 20
PARTS = ("stopping", "sharing")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _summary(values: list[float]) -> dict[str, Any]:
    return {"values_s": values, "median_s": statistics.median(values), "max_s": max(values)}


def stopping(work: Path, rounds: int, delay: float) -> dict[str, Any]:
    """Every event of :data:`interrupts.EVENTS`, ``rounds`` times, interleaved."""
    got: dict[str, dict[str, list[float]]] = {e: {} for e in interrupts.EVENTS}
    for r in range(rounds):
        for event in interrupts.EVENTS:
            one = interrupts.measure(event, work / f"{event}-{r}", delay)
            for key, value in one.items():
                got[event].setdefault(key, []).append(value)
            log(f"round {r + 1}, {event}: " + ", ".join(f"{k} {v:.2f}" for k, v in one.items()))
    return {event: {key: _summary(values) for key, values in per.items()}
            for event, per in got.items()}


def sharing_figures(work: Path) -> dict[str, Any]:
    """USS growth of the readers through views and of the copying control, by start
    method; a fresh reader's figures."""
    root = work / "noise.tsc"
    out: dict[str, Any] = {"store_bytes": sharing.build(root), "readers": sharing.READERS}
    for method in ("spawn", "fork"):
        out[method] = {}
        for mode in ("views", "copy"):
            got = sharing.run_readers(root, method, mode)
            out[method][mode] = {"uss_growth_bytes": [r["after"] - r["before"] for r in got],
                                 "private_bytes": [r["private"] for r in got]}
            log(f"{method}, {mode}: USS growth "
                f"{[round(g / MIB, 1) for g in out[method][mode]['uss_growth_bytes']]} MiB")
    out["fresh"] = sharing.fresh_reader(root)
    return out


def _stopping_table(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    lines = [f"A build with workers=2, a loader of {cfg['delay_s']:g} s a call, stopped once its "
             f"process and its worker compute; {cfg['rounds']} rounds, seconds from the signal:",
             "", "| event | handled: median | handled: max | all gone: median | all gone: max |",
             "|---|---:|---:|---:|---:|"]
    for event, per in report["stopping"].items():
        cells = []
        for key in ("handled_s", "stopped_s"):
            fig = per.get(key)
            cells += ["-", "-"] if fig is None else [f"{fig['median_s']:.2f}", f"{fig['max_s']:.2f}"]
        lines.append(f"| {event} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _sharing_table(s: dict[str, Any]) -> list[str]:
    lines = [f"{s['readers']} readers of a {s['store_bytes'] / MIB:.0f} MiB store, USS growth "
             "of each (MiB), and the store's pages each holds alone (KiB):", "",
             "| readers | views: USS growth | views: private | a copy: USS growth |",
             "|---|---|---|---|"]
    for method in ("spawn", "fork"):
        views, copy = s[method]["views"], s[method]["copy"]
        lines.append(
            f"| {method} | {', '.join(f'{g / MIB:.1f}' for g in views['uss_growth_bytes'])} "
            f"| {', '.join(f'{p / 1024:.0f}' for p in views['private_bytes'])} "
            f"| {', '.join(f'{g / MIB:.1f}' for g in copy['uss_growth_bytes'])} |")
    f = s["fresh"]
    huge = " mapped as pages, and as huge pages" if len(f["open"]) > 2 else ""
    lines += ["", "A fresh process, growth of [anonymous memory, resident pages of the store's "
              f"files{huge}] in MiB: opening {[round(x / MIB, 2) for x in f['open']]}, reading one "
              f"vector {[round(x / MIB, 2) for x in f['one']]}, gathering {f['batch_rows']} "
              f"vectors ({f['batch_bytes'] / MIB:.1f} MiB) {[round(x / MIB, 2) for x in f['batch']]}.",
              ""]
    return lines


def table(report: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.1f}" for x in report["env"].get("loadavg_at_start") or [])
    lines = ["# The guarantees page's figures", "", f"Load average at the start: {load}.", ""]
    if "stopping" in report:
        lines += _stopping_table(report)
    if "sharing" in report:
        lines += _sharing_table(report["sharing"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each event (default 5)")
    parser.add_argument("--delay", type=float, default=0.9,
                        help="seconds of the loader's every call (default 0.9)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to measure (default: both)")
    add_results_options(parser, "guarantees")
    args = parser.parse_args(argv)
    base = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-bench").resolve()
    work = base / "guarantees"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    compile_sources()
    env = environment()
    run = run_stamp("benchmarks.guarantees", argv, env)
    report: dict[str, Any] = {"env": env, "config": {"rounds": args.rounds, "delay_s": args.delay}}
    if "stopping" in args.parts:
        report["stopping"] = stopping(work, args.rounds, args.delay)
    if "sharing" in args.parts:
        report["sharing"] = sharing_figures(work)
    shutil.rmtree(work, ignore_errors=True)
    print(publish(ResultsFile(args.results, args.out), report, table, run, workdir=base,
                  results=args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
