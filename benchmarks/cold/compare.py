"""Two versions of the library, cold builds side by side: the stages of each, medians of rounds.

Run ``python -m benchmarks.cold.compare CHECKOUT_A CHECKOUT_B [--images N] [--rounds R]
[--kinds covers]``, each checkout a directory holding this repository at the version to
measure (``git worktree add --detach DIR COMMIT`` makes one). Round after round, alternately
(A then B in odd rounds, B then A in even ones), it runs ``python -m
benchmarks.cold.cold_timeline --rounds 1`` in each checkout (the checkout's own library and
timeline, the same covers) and reduces each build's stamps to its stages, in seconds of the
building process's clock and in CPU seconds:

- ``worker start``: a worker's process start to its imports done (wall) and its CPU then;
- ``imbalance``: between the last items of the building process and of the worker;
- ``last item to close``: the later last item to the pool's close (the last shard written);
- ``pool close``, ``close to publish`` (the index and the metadata written), ``publish``;
- ``after the last item``: from the later last item to the call's return;
- ``CPU``: the building process's, the workers' it reaped, and its helper processes';
- ``wall``: the whole call.

It prints each stage's median and every round's figure for both checkouts, and the load
average at each build's start, and writes what it prints, with every round's figures and
each checkout's commit, to ``benchmarks/results/cold/compare.json`` and ``.md``, stamped
with the run (``--results DIR``, ``--out NAME`` write them elsewhere). A checkout whose
timeline writes stamped results writes them into a temporary directory, never its own.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common._record import Record, add_results_options
from benchmarks.common._timeline import caller, event_lines

__all__ = ["main", "stages"]

_CPU = re.compile(r"building process ([\d.]+) s during the call, the workers it reaped ([\d.]+) s")


def stages(output: str, load: float | None = None) -> dict[str, float]:
    """The stages of the one build whose timeline ``output`` holds (``load``: the load
    average at its start, when ``output`` does not say it)."""
    rows = event_lines(output)
    builder = caller(rows)
    at: dict[tuple[str, str], tuple[float, float]] = {}
    for t, pid, cpu, what in rows:
        if cpu is None:
            raise ValueError(f"an event without its CPU seconds: {what!r} of pid {pid}")
        who = "builder" if pid == builder else "worker"
        at.setdefault((who, what.split(" (")[0]), (t, cpu))
        if what.startswith("last stamped item"):
            at[(who, "last stamped item")] = (t, cpu)
    cpu = _CPU.search(output)
    assert cpu is not None, output
    helpers = sum(float(x) for x in re.findall(r"\(([\d.]+) s during the call", output))
    if load is None:
        load = float(output.split("load average at the start: ")[1].split(",")[0])
    out = {"load at the start": load, "CPU, building process": float(cpu.group(1)),
           "CPU, workers reaped": float(cpu.group(2)), "CPU, helper processes": helpers}
    out["CPU, all"] = out["CPU, building process"] + out["CPU, workers reaped"] + helpers
    started = at.get(("worker", "process started"))
    ready = at.get(("worker", "imports done, loader received"))
    if started and ready:
        out["worker start s"] = ready[0] - started[0]
        out["worker start, CPU s"] = ready[1]
    close, closed = at[("builder", "pool close started")][0], at[("builder", "pool close returned")][0]
    # a process's last stamped item (every 50), else its first (a small build)
    last, worker_last = (at.get((who, "last stamped item"), at.get((who, "first item")))
                         for who in ("builder", "worker"))
    last = last or worker_last or (close, 0.0)
    end = max(last[0], (worker_last or last)[0])
    publish, published = at[("builder", "publish started")][0], at[("builder", "publish returned")][0]
    out.update({"imbalance s": abs((worker_last or last)[0] - last[0]),
                "last item to close s": close - end,
                "pool close s": closed - close, "close to publish s": publish - closed,
                "publish s": published - publish,
                "after the last item s": at[("builder", "returned")][0] - end,
                "wall s": at[("builder", "returned")][0] - at[("builder", "call")][0]})
    return out


def _timeline(checkout: Path, args: argparse.Namespace) -> dict[str, float]:
    """One cold build's stages in ``checkout`` (its own library and timeline)."""
    command = [sys.executable, "-m", "benchmarks.cold.cold_timeline", "--images",
               str(args.images), "--rounds", "1", "--kinds", args.kinds]
    if args.workdir:
        command += ["--workdir", str(args.workdir)]
    timeline = (checkout / "benchmarks" / "cold" / "cold_timeline.py").read_text()
    with tempfile.TemporaryDirectory(prefix="tsc-compare-") as results:
        stamped = "--results" in timeline  # a timeline that writes stamped results
        if stamped:
            command += ["--results", results]
        out = subprocess.run(command, cwd=checkout, capture_output=True, text=True,
                             check=True).stdout
        load = None
        if stamped:
            report = json.loads((Path(results) / "timeline.json").read_text())
            load = report["env"]["loadavg_at_start"][0]
    return stages(out, load)


def _commit(checkout: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True,
                          text=True, check=True).stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs=2, type=Path, help="two checkouts of the repository")
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kinds", default="covers", help="covers or records")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="the timelines' --workdir (default theirs)")
    add_results_options(parser, "cold")
    parser.set_defaults(out="compare")
    args = parser.parse_args(argv)
    record = Record("benchmarks.cold.compare", list(argv) if argv is not None else None,
                    results=args.results, name=args.out)
    names = ["A", "B"]  # the checkouts by their commits: no directory of this machine
    record.config = {"images": args.images, "rounds": args.rounds, "kinds": args.kinds,
                     "commits": {n: _commit(c) for n, c in zip(names, args.checkouts, strict=True)}}
    seen: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for r in range(args.rounds):
        order = list(zip(names, args.checkouts, strict=True))
        for name, checkout in order if r % 2 == 0 else order[::-1]:
            for stage, value in _timeline(checkout, args).items():
                seen[name].setdefault(stage, []).append(value)
    record.print("```text")
    for name, figures in seen.items():
        record.print(f"{name}, commit {record.config['commits'][name][:12]} ({args.kinds}, "
                     f"{args.images:,} covers, {args.rounds} rounds):")
        for stage, values in figures.items():
            record.print(f"  {stage:28s} median {statistics.median(values):7.3f}   "
                         + ", ".join(f"{v:.3f}" for v in values))
        record.print()
    record.print("```")
    record.figures = {"checkouts": seen}
    record.save(workdir=args.workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
