"""The benchmark: seven ways to give many agent processes the same preprocessed vectors.

Run ``python -m benchmarks.run [--images N] [--quick] [--workdir DIR]``. It generates
the cover images (once per size, see :mod:`benchmarks.make_images`), then for every
method of :mod:`benchmarks.methods`, in fresh ``spawn``-ed agent processes:

- the first agent's time until it holds the vector of every unique path (building
  the cache included), and a later agent's with the cache in place;
- open/load time, single lookups by path per second, random batches of 256 per
  second, one torch DataLoader epoch (``num_workers=2``), a full pass;
- USS and PSS of K = 1, 2, 4 agents holding the full column at the same time, and of a
  baseline agent that imported the same libraries (growth is reported over it);
- disk bytes; then open/load time at three store sizes, written with random vectors.

Writes ``latest.md``, ``latest.json`` and PNG plots into ``benchmarks/results/`` (or
``--results``) and prints the markdown table, with the project's target ratios marked
PASS or MISS.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _report, make_images, methods
from benchmarks._driver import run_round, set_start_method
from benchmarks.methods._base import ITEM_BYTES, SyntheticLoader
from benchmarks.methods.torch_save import UNSAFE_NOTE

DEFAULT_IMAGES = 10_000
QUICK_IMAGES = 200
DEFAULT_OPEN_SIZES = (5_000, 20_000, 80_000)
QUICK_OPEN_SIZES = (100, 200, 400)
RESULTS = Path(__file__).resolve().parent / "results"
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
    verify_rows: list[int] = field(default_factory=list)


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def unique_paths(data: Path) -> tuple[list[str], int]:
    """The unique cover paths of ``ratings.csv`` (first appearance), absolute; row count."""
    import pandas as pd

    ratings = pd.read_csv(data / make_images.RATINGS, dtype={"isbn": str})
    rel = ratings["img_path"].drop_duplicates().tolist()
    root = str(data.resolve())
    return [os.path.join(root, p) for p in rel], len(ratings)


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


def bench_method(name: str, cfg: Config, paths: list[str], paths_file: str) -> dict[str, Any]:
    method = methods.get(name)
    state = method.prepare(cfg.workdir / "methods" / name, paths)
    servers = method.server_pids(state)
    vdir = cfg.workdir / "verify"
    vdir.mkdir(parents=True, exist_ok=True)
    job = {"method": name, "state": state, "paths_file": paths_file, "seed": cfg.seed,
           "budget_s": cfg.budget_s, "verify_rows": cfg.verify_rows}
    rec: dict[str, Any] = {"summary": method.summary}
    if name == "torch_save":
        log(UNSAFE_NOTE)
    try:
        log(f"{name}: first agent")
        (first,), _ = run_round(
            [dict(job, tasks=["load", "verify"], verify_file=str(vdir / f"{name}-first.npy"))],
            servers,
        )
        rec["first_agent_s"] = first["load_s"]
        rec["first_agent_hit"] = first["hit"]
        rec["disk_bytes"] = method.disk_bytes(state)
        rec["memory"] = {}
        for k in cfg.agents:
            log(f"{name}: {k} agent(s) with the cache in place, and a baseline")
            jobs = [dict(job, tasks=["load", "full_pass", "hold"]) for _ in range(k)]
            if k == 1:
                jobs[0]["tasks"] = ["load", "full_pass", "hold", "verify", "lookups", "batches",
                                    "dataloader"]
                jobs[0]["verify_file"] = str(vdir / f"{name}-later.npy")
            jobs.append(dict(job, tasks=["baseline"]))
            results, mem = run_round(jobs, servers)
            assert mem is not None
            summary = _mem_summary(mem)
            summary["load_s"] = [r["load_s"] for r in results[:k]]
            rec["memory"][str(k)] = summary
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
        top = rec["memory"].get("4") or rec["memory"][str(max(cfg.agents))]
        rec["uss_total_bytes_4_agents"] = top["uss_total_bytes"] if "4" in rec["memory"] else None
        rec["pss_total_bytes_4_agents"] = top["pss_total_bytes"] if "4" in rec["memory"] else None
        rec["uss_growth_bytes_4_agents"] = (
            top.get("uss_growth_bytes") if "4" in rec["memory"] else None
        )
        rec["anon_growth_bytes_4_agents"] = (
            top.get("anon_growth_bytes") if "4" in rec["memory"] else None
        )
    finally:
        method.teardown()
    return rec


def bench_open_vs_n(name: str, cfg: Config) -> dict[str, Any]:
    """Open/load time of a later agent at each size, on stores of random vectors."""
    method = methods.get(name)
    out: dict[str, Any] = {}
    for n in cfg.open_sizes:
        root = cfg.workdir / "open" / name / str(n)
        paths = [f"{cfg.workdir}/synthetic/{i // 1000:04d}/{i:08d}.jpg" for i in range(n)]
        paths_file = write_paths(paths, cfg.workdir / "open" / f"paths-{n}.txt")
        state = method.prepare(root, paths)
        try:
            t0 = time.perf_counter()
            column = method.load(state, paths, SyntheticLoader())
            column.close()
            write_s = time.perf_counter() - t0
            del column
            gc.collect()
            runs = []
            for _ in range(cfg.open_repeats):  # each in a fresh agent process
                (res,), _ = run_round([{"method": name, "state": state, "paths_file": paths_file,
                                        "tasks": ["load"], "synthetic": True}])
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
        finally:
            method.teardown()
            shutil.rmtree(root, ignore_errors=True)
    return out


def check_vectors(cfg: Config, names: list[str]) -> dict[str, bool | None]:
    vdir = cfg.workdir / "verify"
    ref_file = vdir / "no_cache-first.npy"
    if not ref_file.exists():
        return {name: None for name in names}
    ref = np.load(ref_file)
    equal: dict[str, bool | None] = {}
    for name in names:
        files = [vdir / f"{name}-first.npy", vdir / f"{name}-later.npy"]
        equal[name] = all(f.exists() and np.array_equal(np.load(f), ref) for f in files)
    return equal


def parse(argv: list[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=None,
                        help=f"unique covers (default {DEFAULT_IMAGES}; 181777 = the seed's scale)")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny run ({QUICK_IMAGES} covers, short budgets), for tests")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch directory (default: $TMPDIR/tensorstore-cache-bench)")
    parser.add_argument("--data", type=Path, default=None,
                        help="image directory (default: WORKDIR/data-N-sSEED, reused)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output directory")
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
        methods.get(name)  # fail early on a typo
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
    return Config(images, args.seed, workdir, data, args.results.resolve(), names, agents,
                  sizes, budget, quick, start, repeats)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    set_start_method(cfg.start_method)
    started = time.time()
    env = _report.environment()
    log(f"generating {cfg.images} covers into {cfg.data}")
    t0 = time.perf_counter()
    make_images.generate(cfg.data, cfg.images, cfg.seed)
    gen_s = time.perf_counter() - t0
    paths, ratings_rows = unique_paths(cfg.data)
    for sub in ("methods", "verify", "open", "paths"):
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
    env["command"] = " ".join([Path(sys.executable).name, "-m", "benchmarks.run", *sys.argv[1:]])
    results: dict[str, Any] = {}
    for name in cfg.methods:
        results[name] = bench_method(name, cfg, paths, paths_file)
    for name, same in check_vectors(cfg, cfg.methods).items():
        results[name]["vectors_equal_no_cache"] = same
    open_vs_n: dict[str, Any] = {}
    for name in cfg.methods:
        if methods.get(name).synthetic:
            log(f"{name}: open/load time vs N {cfg.open_sizes}")
            open_vs_n[name] = bench_open_vs_n(name, cfg)
    for name in cfg.methods:
        results[name].setdefault("open_s", None)
    env["wall_s"] = time.time() - started
    report = {"env": env, "methods": results, "open_vs_n": open_vs_n,
              "targets": _report.targets(results, open_vs_n, cfg.open_sizes),
              "config": {k: str(v) if isinstance(v, Path) else v
                         for k, v in asdict(cfg).items() if k != "verify_rows"}}
    cfg.results.mkdir(parents=True, exist_ok=True)
    (cfg.results / "latest.json").write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")
    text = _report.markdown(report)
    (cfg.results / "latest.md").write_text(text)
    _report.plots(report, cfg.results)
    print(text)
    log(f"done in {env['wall_s']:.0f} s; results in {cfg.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
