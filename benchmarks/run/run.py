"""The benchmark: seven ways to give many agent processes the same preprocessed vectors.

Run ``python -m benchmarks.run [--images N] [--quick] [--workdir DIR]``. It generates
the cover images (once per size, see :mod:`benchmarks.common.make_images`), then for every
method of :mod:`benchmarks.common.methods`, in fresh ``spawn``-ed agent processes:

- the first agent's time until it holds the vector of every unique path (building
  the cache included), and a later agent's with the cache in place;
- open/load time, single lookups by path per second, random batches of 256 per
  second, one torch DataLoader epoch (``num_workers=2``), a full pass;
- USS and PSS of K = 1, 2, 4 agents holding the full column at the same time, and of a
  baseline agent that imported the same libraries (growth is reported over it);
- disk bytes; then open/load time at three store sizes, written with random vectors;
- then every method's first agent again, in ``--first-rounds`` interleaved rounds (each round
  in a rotated order, each agent on an empty cache): the first agent's time is the median of
  the rounds, reported with every round's time, the spread and the agent's CPU seconds
  (see :mod:`benchmarks.run._first_rounds`);
- then the random batches of the methods the batch target compares, in ``--batch-rounds``
  interleaved rounds (each method's cache built once, a fresh later agent per round): their
  rate is the median of the rounds (see :mod:`benchmarks.run._batch_rounds`).

A method whose agent is killed (the kernel's OOM killer included), raises, or runs
past ``--agent-timeout`` has that round recorded as its result (status, signal, last
sampled memory, elapsed time) and the run goes on; rounds of K agents that would not
fit in the available memory are skipped unless ``--allow-oom`` (see
:mod:`benchmarks.run._rounds`). The run exits 0 either way.

Writes ``NAME.json`` and ``NAME.md`` (``--out NAME``, default ``latest``), rewritten
atomically after each method, and PNG plots into ``benchmarks/results/run/`` (or
``--results``), and prints the markdown table, with the project's target ratios marked
PASS or MISS (or FAILED / SKIPPED where a figure they need could not be measured).
``--resume`` keeps the methods ``NAME.json`` already holds for the same configuration.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import _report, make_images, methods
from benchmarks.common._memory import available_memory, gb
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import now, run_stamp
from benchmarks.common.methods._base import ITEM_BYTES
from benchmarks.run import _batch_rounds, _first_rounds, _plots
from benchmarks.run._driver import AGENT_TIMEOUT_S, set_start_method
from benchmarks.run._rounds import (
    Config,
    bench_method,
    bench_open_vs_n,
    check_vectors,
    log,
    write_paths,
)

DEFAULT_IMAGES = 10_000
QUICK_IMAGES = 200
DEFAULT_OPEN_SIZES = (5_000, 20_000, 80_000)
QUICK_OPEN_SIZES = (100, 200, 400)
RESULTS = Path(__file__).resolve().parents[1] / "results" / "run"
IMAGE_BYTES = 7_000  # a generated cover on disk, about (6.5 kB measured at 20,000)


def unique_paths(data: Path) -> tuple[list[str], int]:
    """The unique cover paths of ``ratings.csv`` (first appearance), absolute; row count."""
    import pandas as pd

    ratings = pd.read_csv(data / make_images.RATINGS, dtype={"isbn": str})
    rel = ratings["img_path"].drop_duplicates().tolist()
    root = str(data.resolve())
    return [os.path.join(root, p) for p in rel], len(ratings)


def disk_check(cfg: Config) -> dict[str, Any]:
    """Free disk under the work directory against what the run will write, at most.

    The free space is that of the work directory's nearest existing directory (itself once
    made), recorded as the work directory's: the report names no other directory.
    """
    images = 0 if make_images.is_complete(cfg.data, cfg.images, cfg.seed) else (
        cfg.images * IMAGE_BYTES)
    n = cfg.images  # unique covers
    # one method's cache at a time (each is deleted once measured; the pickled Series
    # and a map() in two processes take about twice the column), the largest
    # open-time store, the images
    need = images + 2 * n * ITEM_BYTES + 2 * max(cfg.open_sizes, default=0) * ITEM_BYTES
    probe = cfg.workdir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    check = {"path": str(cfg.workdir), "free_bytes": free, "need_bytes": need,
             "short": free < need}
    if check["short"]:
        log(f"WARNING: {probe} has {gb(free)} free; this run may write about {gb(need)} "
            "(images, one method's cache, open-time stores): methods may fail for lack of "
            "disk (pass --workdir on a larger disk)")
    else:
        log(f"disk: about {gb(need)} needed, {gb(free)} free under {probe}")
    return check


def parse(argv: list[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=None,
                        help=f"unique covers (default {DEFAULT_IMAGES}; 181777 = the original script's scale)")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny run ({QUICK_IMAGES} covers, short budgets), for tests")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch directory (default: $TMPDIR/tensorstore-cache-bench)")
    parser.add_argument("--data", type=Path, default=None,
                        help="image directory (default: WORKDIR/data-N-sSEED, reused)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output directory")
    parser.add_argument("--out", default="latest",
                        help="results name: writes NAME.json, NAME.md and NAME-*.png "
                        "(default latest, whose plots keep their plain names)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the methods already measured in NAME.json with the same "
                        "configuration, run the others")
    parser.add_argument("--methods", default=",".join(methods.METHODS),
                        help="comma-separated subset of: " + ", ".join(methods.METHODS))
    parser.add_argument("--agents", default=None, help="agent counts (default 1,2,4)")
    parser.add_argument("--open-sizes", default=None,
                        help="store sizes for open time vs N (default 5000,20000,80000)")
    parser.add_argument("--open-scale", type=float, default=1.0,
                        help="multiply the open-time sizes by this factor")
    parser.add_argument("--open-repeats", type=int, default=None,
                        help="fresh agents per open-time measurement, median (default 3; quick 1)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per rate measurement (default 1.0; quick 0.1)")
    parser.add_argument("--agent-timeout", type=float, default=AGENT_TIMEOUT_S,
                        help="seconds a round's agents may run before they are stopped and "
                        f"the round is recorded as timed out (default {AGENT_TIMEOUT_S:g})")
    parser.add_argument("--allow-oom", action="store_true",
                        help="run rounds of K agents even where the 1-agent round's memory x K "
                        "exceeds the available memory (their agents may be killed by the "
                        "kernel: recorded as results); without it such rounds are skipped")
    parser.add_argument("--first-rounds", type=int, default=None,
                        help="interleaved rounds of every method's first agent, whose median is "
                        "the first agent's time (default 5; quick 2; 0: only the single first "
                        "agent measured with each method's other rounds)")
    parser.add_argument("--batch-rounds", type=int, default=None,
                        help="interleaved rounds of the random batches of the methods the batch "
                        "target compares, whose median is their rate (default 5; quick 2; 0: "
                        "only the single rate measured with each method's other rounds)")
    parser.add_argument("--start-method", choices=("spawn", "forkserver"), default=None,
                        help="how agents start (default spawn: fresh interpreters; "
                        "--quick defaults to forkserver, which starts them in milliseconds)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    quick = args.quick
    images = args.images or (QUICK_IMAGES if quick else DEFAULT_IMAGES)
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-bench").resolve()
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    for name in names:
        try:
            methods.get(name)  # fail early on a typo
        except KeyError as exc:
            parser.error(str(exc.args[0]))
    agents = [int(k) for k in args.agents.split(",")] if args.agents else [1, 2, 4]
    if 1 not in agents:
        agents.insert(0, 1)
    if args.open_sizes:
        sizes = [int(s) for s in args.open_sizes.split(",")]
    else:
        sizes = list(QUICK_OPEN_SIZES if quick else DEFAULT_OPEN_SIZES)
    sizes = [max(1, round(s * args.open_scale)) for s in sizes]
    data = (args.data or workdir / f"data-{images}-s{args.seed}").resolve()
    budget = args.budget if args.budget is not None else (0.1 if quick else 1.0)
    start = args.start_method or ("forkserver" if quick else "spawn")
    repeats = args.open_repeats or (1 if quick else 3)
    first_rounds = args.first_rounds if args.first_rounds is not None else (2 if quick else 5)
    batch_rounds = args.batch_rounds if args.batch_rounds is not None else (2 if quick else 5)
    for flag, rounds in (("--first-rounds", first_rounds), ("--batch-rounds", batch_rounds)):
        if rounds < 0:
            parser.error(f"{flag} must be >= 0, got {rounds}")
    if args.agent_timeout <= 0:
        parser.error(f"--agent-timeout must be > 0 seconds, got {args.agent_timeout:g}")
    try:
        files = ResultsFile(args.results.resolve(), args.out)
    except ValueError as exc:
        parser.error(f"--out: {exc}")
    return Config(images, args.seed, workdir, data, files.directory, names, agents, sizes,
                  budget, quick, start, repeats, files.name, args.resume, args.agent_timeout,
                  args.allow_oom, first_rounds, batch_rounds)


def _config_dict(cfg: Config) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v
            for k, v in asdict(cfg).items() if k != "verify_rows"}


def _order(results: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Methods in table order: the registry's, then the others as given."""
    known = [m for m in methods.METHODS if m in results]
    return {m: results[m] for m in [*known, *(m for m in names if m not in known),
                                    *(m for m in results if m not in known and m not in names)]
            if m in results}


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    files = ResultsFile(cfg.results, cfg.out)
    try:
        previous = files.resume(_config_dict(cfg)) if cfg.resume else None
    except ValueError as exc:
        log(f"error: {exc}")
        return 2
    set_start_method(cfg.start_method)
    started = time.time()
    _report.compile_sources()
    env = _report.environment()
    env["disk"] = disk_check(cfg)
    env["available_memory_at_start"] = available_memory()[0]
    log(f"generating {cfg.images} covers into {cfg.data}")
    t0 = time.perf_counter()
    make_images.generate(cfg.data, cfg.images, cfg.seed)
    gen_s = time.perf_counter() - t0
    paths, ratings_rows = unique_paths(cfg.data)
    for sub in ("methods", "open", "paths") if previous else ("methods", "verify", "open", "paths"):
        shutil.rmtree(cfg.workdir / sub, ignore_errors=True)
    paths_file = write_paths(paths, cfg.workdir / "paths" / "unique.txt")
    rng = np.random.default_rng(cfg.seed)
    n = len(paths)
    cfg.verify_rows = (sorted(rng.choice(n, 1024, replace=False).tolist()) if n > 1024
                       else list(range(n)))
    env["sizes"] = {"images": cfg.images, "unique_paths": n, "ratings_rows": ratings_rows,
                    "item_bytes": ITEM_BYTES, "column_bytes": n * ITEM_BYTES,
                    "agents": cfg.agents, "open_sizes": cfg.open_sizes,
                    "rate_budget_s": cfg.budget_s, "quick": cfg.quick,
                    "agent_start_method": cfg.start_method, "open_repeats": cfg.open_repeats,
                    "image_generation_s": gen_s}
    run = run_stamp("benchmarks.run", argv, env)
    env["command"] = run["command"]
    if previous:
        report = previous
        report["env"].setdefault("runs", []).append(
            {"date": env["date"], "command": env["command"], "resumed": True})
        log(f"resuming {files.json}: {', '.join(report['methods']) or 'nothing'} measured")
    else:
        env["runs"] = [{"date": env["date"], "command": env["command"], "resumed": False}]
        report = {"env": env, "config": _config_dict(cfg), "methods": {}, "open_vs_n": {},
                  "targets": {}}
    count = _measured(report)
    try:
        _measure(cfg, report, files, started, paths, paths_file, run)
        _rounds_of_first_agents(cfg, report, files, started, paths, paths_file, run)
        _rounds_of_batches(cfg, report, files, started, paths, paths_file, run)
    except KeyboardInterrupt:
        log(f"interrupted: {files.json} holds the methods measured so far "
            f"({', '.join(report['methods']) or 'none'}); --resume goes on from there")
        return 130
    if previous and _measured(report) == count:
        report["env"]["runs"].pop()  # nothing measured: the tables and plots are redrawn
        log(f"{files.json}: every method is measured; tables and plots redrawn")
        text = _save(report, files, None, cfg, run)
    else:
        text = _save(report, files, started, cfg, run)
    _plots.plots(report, files.directory, prefix=files.plot_prefix)
    print(text)
    failed = [f"{m} ({k})" for m, r in report["methods"].items()
              for k, rr in r.get("rounds", {}).items() if rr.get("status") != "ok"]
    if failed:
        log(f"rounds that failed or were skipped (recorded as results): {', '.join(failed)}")
    log(f"done in {time.time() - started:.0f} s; results in {files.json}")
    return 0


def _measure(cfg: Config, report: dict[str, Any], files: ResultsFile, started: float,
             paths: list[str], paths_file: str, run: dict[str, Any]) -> None:
    """Measure every method not yet in ``report``; save the report after each."""
    for name in cfg.methods:
        if name in report["methods"]:
            log(f"{name}: already measured in {files.json}, skipped (--resume)")
            continue
        method_t0 = time.time()
        rec = bench_method(name, cfg, paths, paths_file)
        rec["vectors_equal_no_cache"] = check_vectors(cfg, name)
        rec.setdefault("open_s", None)
        if methods.get(name).synthetic:
            log(f"{name}: open/load time vs N {cfg.open_sizes}")
            report["open_vs_n"][name] = bench_open_vs_n(name, cfg)
            report["open_vs_n"] = _order(report["open_vs_n"], cfg.methods)
        rec["measured"] = {"date": now(), "wall_s": round(time.time() - method_t0, 1)}
        report["methods"][name] = rec
        report["methods"] = _order(report["methods"], cfg.methods)
        _save(report, files, started, cfg, run)


def _rounds_of_first_agents(cfg: Config, report: dict[str, Any], files: ResultsFile,
                            started: float, paths: list[str], paths_file: str,
                            run: dict[str, Any]) -> None:
    """The interleaved rounds of every measured method's first agent (kept as they are by
    ``--resume`` when they hold every method); the first agent's time becomes their median."""
    names = [m for m in report["methods"] if m in cfg.methods]
    done = report.get("first_rounds") or {}
    if cfg.first_rounds < 1 or (set(done.get("methods", {})) == set(names) and names):
        return
    log(f"first agents, {cfg.first_rounds} interleaved rounds of {', '.join(names)}")
    report["first_rounds"] = _first_rounds.first_rounds(cfg, names, paths, paths_file)
    _first_rounds.apply(report["methods"], report["first_rounds"])
    _save(report, files, started, cfg, run)


def _rounds_of_batches(cfg: Config, report: dict[str, Any], files: ResultsFile,
                       started: float, paths: list[str], paths_file: str,
                       run: dict[str, Any]) -> None:
    """The interleaved rounds of the random batches of the methods the batch target
    compares (kept as they are by ``--resume`` when they hold them all); their rates become
    the medians."""
    names = [m for m in _batch_rounds.METHODS if m in report["methods"]]
    done = report.get("batch_rounds") or {}
    if cfg.batch_rounds < 1 or len(names) < 2 or set(done.get("methods", {})) == set(names):
        return
    log(f"random batches, {cfg.batch_rounds} interleaved rounds of {', '.join(names)}")
    report["batch_rounds"] = _batch_rounds.batch_rounds(cfg, names, paths, paths_file)
    _batch_rounds.apply(report["methods"], report["batch_rounds"])
    _save(report, files, started, cfg, run)


def _measured(report: dict[str, Any]) -> tuple[int, bool, bool]:
    """What a run has measured: its methods, and whether each kind of rounds ran."""
    return (len(report["methods"]), bool(report.get("first_rounds")),
            bool(report.get("batch_rounds")))


def _markdown(report: dict[str, Any]) -> str:
    """The report's markdown, with the sections of the first agents' and the batches'
    rounds."""
    return _report.markdown(report, lambda r: [
        *_first_rounds.markdown(r.get("first_rounds")),
        *_batch_rounds.markdown(r.get("batch_rounds"))])


def _save(report: dict[str, Any], files: ResultsFile, started: float | None,
          cfg: Config, run: dict[str, Any]) -> str:
    """Rewrite the results file and its table with what is measured so far (and this
    run's wall time, unless ``started`` is None), stamped by ``run``, with portable paths
    (see :mod:`benchmarks.common._portable`); return the table."""
    env = report["env"]
    runs = env.setdefault("runs", [{}])
    if started is not None:
        runs[-1]["wall_s"] = round(time.time() - started, 1)
    env["wall_s"] = sum(r.get("wall_s", 0.0) for r in runs)
    report["config"]["methods"] = list(report["methods"])
    report["targets"] = _report.targets(report["methods"], report["open_vs_n"],
                                        report["config"]["open_sizes"])
    return _report.publish(files, report, _markdown, run, data=cfg.data,
                           workdir=cfg.workdir, results=cfg.results)


if __name__ == "__main__":
    raise SystemExit(main())
