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
average at each build's start.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "stages"]

_EVENT = re.compile(r"^ *([\d.]+) s  pid (\d+)  cpu +([\d.]+) s  (.*)$", re.M)
_CPU = re.compile(r"building process ([\d.]+) s during the call, the workers it reaped ([\d.]+) s")


def stages(output: str) -> dict[str, float]:
    """The stages of the one build whose timeline ``output`` holds."""
    rows = _EVENT.findall(output)
    builder = rows[0][1]
    at: dict[tuple[str, str], tuple[float, float]] = {}
    for t, pid, cpu, what in rows:
        who = "builder" if pid == builder else "worker"
        at.setdefault((who, what.split(" (")[0]), (float(t), float(cpu)))
        if what.startswith("last stamped item"):
            at[(who, "last stamped item")] = (float(t), float(cpu))
    cpu = _CPU.search(output)
    assert cpu is not None, output
    helpers = sum(float(x) for x in re.findall(r"\(([\d.]+) s during the call", output))
    out = {"load at the start": float(output.split("start: ")[1].split(",")[0]),
           "CPU, building process": float(cpu.group(1)),
           "CPU, workers reaped": float(cpu.group(2)), "CPU, helper processes": helpers}
    out["CPU, all"] = out["CPU, building process"] + out["CPU, workers reaped"] + helpers
    started = at.get(("worker", "process started"))
    ready = at.get(("worker", "imports done, loader received"))
    if started and ready:
        out["worker start s"] = ready[0] - started[0]
        out["worker start, CPU s"] = ready[1]
    last = at[("builder", "last stamped item")][0]
    worker_last = at.get(("worker", "last stamped item"), (last, 0.0))[0]
    end = max(last, worker_last)
    close, closed = at[("builder", "pool close started")][0], at[("builder", "pool close returned")][0]
    publish, published = at[("builder", "publish started")][0], at[("builder", "publish returned")][0]
    out.update({"imbalance s": abs(worker_last - last), "last item to close s": close - end,
                "pool close s": closed - close, "close to publish s": publish - closed,
                "publish s": published - publish,
                "after the last item s": at[("builder", "returned")][0] - end,
                "wall s": at[("builder", "returned")][0] - at[("builder", "call")][0]})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs=2, type=Path, help="two checkouts of the repository")
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kinds", default="covers", help="covers or records")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="the timelines' --workdir (default theirs)")
    args = parser.parse_args(argv)
    extra = ["--workdir", str(args.workdir)] if args.workdir else []
    seen: dict[Path, dict[str, list[float]]] = {c: {} for c in args.checkouts}
    for r in range(args.rounds):
        for checkout in args.checkouts if r % 2 == 0 else args.checkouts[::-1]:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.cold.cold_timeline", "--images",
                 str(args.images), "--rounds", "1", "--kinds", args.kinds, *extra],
                cwd=checkout, capture_output=True, text=True, check=True).stdout
            for stage, value in stages(out).items():
                seen[checkout].setdefault(stage, []).append(value)
    for checkout, figures in seen.items():
        print(f"\n{checkout} ({args.kinds}, {args.images:,} covers, {args.rounds} rounds):")
        for stage, values in figures.items():
            print(f"  {stage:28s} median {statistics.median(values):7.3f}   "
                  + ", ".join(f"{v:.3f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
