"""The headline benchmark: a real hyperparameter sweep, end to end, for every method.

Run ``python -m benchmarks.sweep [--images N] [--agents K] [--trials N] [--runs R]`` or
``python -m benchmarks.sweep --scale original`` (129,777 train + 52,000 test covers).

What a user decides on: "my sweep of N trials with K agents in parallel took how long, how
much of it was waiting for data, and did the machine run out of memory?". For each method
(no cache, the original's Manager dict and ``torch.save``, Hugging Face ``datasets``,
tensorstore_cache, checking its sources' stat as by default, and
``tensorstore_cache_none``, the same with ``identity="none"``) the same Optuna study is run (SQLite storage, ``load_if_exists``, the
same hyperparameter configurations enqueued in the same order) by K agent lanes: a lane
asks the study for a trial (``study.ask()``), starts a fresh ``python`` process for it
(:mod:`benchmarks.sweep.sweep_trial`: get the vectors of the ratings table's rows through the
method, train a small CNN for a fixed number of steps, report the validation RMSE), and
tells the study the result. Each method starts from an empty cache.

Measured per method: the sweep's wall time; per trial, the time to its first batch from
the process's start (interpreter and imports reported apart) and its share of the trial;
decode CPU time counted inside the loader, wherever it runs; the node's peak memory while
the trials run (PSS of the trial processes, their children and helpers, plus the page
cache of the method's files, see :mod:`benchmarks.sweep._node_memory`); bytes the trials wrote.
A round of K trials with the same imports and training on synthetic batches gives the
agents' own memory. Every configuration's RMSE is compared across methods.

Writes ``NAME.json``, ``NAME.md`` and ``NAME_timeline.png`` into ``--results``
(``NAME`` is ``--out``, ``sweep`` by default, ``sweep-original`` at the original scale),
prints the table and the targets, PASS or MISS, judged against the spread of the runs.
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import _report, make_images, methods
from benchmarks.common._disk import dir_bytes
from benchmarks.common._portable import portable
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import run_stamp, stamp
from benchmarks.common.methods._base import ITEM_BYTES
from benchmarks.sweep import _sweep_report
from benchmarks.sweep._node_memory import NodeMemory
from benchmarks.sweep._sweep_agents import Job, run_lanes
from benchmarks.sweep.sweep_trial import AUTHKEY_ENV

METHODS = ("no_cache", "manager_vectors", "torch_save", "hf_datasets", "tensorstore_cache",
           "tensorstore_cache_none")
DEFAULT_IMAGES = 20_000
ORIGINAL_TRAIN, ORIGINAL_TEST = 129_777, 52_000
RESULTS = Path(__file__).resolve().parents[1] / "results" / "sweep"
#: the hyperparameter configurations every method's study is given, in this order
CONFIGS: list[dict[str, Any]] = [
    {"lr": lr, "batch_size": bs}
    for lr, bs in [(1e-3, 128), (3e-3, 64), (1e-2, 256), (3e-4, 128), (2e-3, 256), (5e-3, 64),
                   (7e-4, 256), (1.5e-2, 128), (4e-4, 64), (6e-3, 128), (1.2e-3, 64),
                   (2.5e-2, 256), (8e-3, 256), (5e-4, 128), (4e-3, 128), (1.8e-3, 64)]
]
LR_RANGE = (1e-4, 1e-1)
BATCH_SIZES = [64, 128, 256]


@dataclass
class Config:
    scale: str
    images: int
    train_covers: int
    seed: int
    agents: int
    trials: int
    steps: int
    runs: int
    methods: list[str]
    workdir: Path
    data: Path
    results: Path
    out: str
    eval_rows: int
    val_fraction: float
    trial_timeout_s: float
    sample_period_s: float
    tolerance: float
    faults: dict[str, tuple[int, str]]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepare_tables(cfg: Config) -> dict[str, Any]:
    """Generate the covers (once), split them into train and test covers and ratings tables.

    The unique covers of ``ratings.csv``, in order of first appearance, are split: the
    first ``train_covers`` are the train covers, the rest the test covers; each ratings
    row goes with its cover. Paths are written absolute.
    """
    import pandas as pd

    t0 = time.perf_counter()
    make_images.generate(cfg.data, cfg.images, cfg.seed)
    gen_s = time.perf_counter() - t0
    ratings = pd.read_csv(cfg.data / make_images.RATINGS, dtype={"isbn": str})
    ratings["img_path"] = str(cfg.data.resolve()) + os.sep + ratings["img_path"]
    unique = ratings["img_path"].drop_duplicates().tolist()
    train_set = set(unique[: cfg.train_covers])
    is_train = ratings["img_path"].isin(train_set)
    tables = cfg.workdir / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    train_table, test_table = tables / "train_ratings.csv", tables / "test_ratings.csv"
    ratings[is_train].to_csv(train_table, index=False)
    ratings[~is_train].drop(columns=["rating"]).to_csv(test_table, index=False)
    return {"train_table": str(train_table), "test_table": str(test_table), "sources": unique,
            "train_covers": len(train_set), "test_covers": len(unique) - len(train_set),
            "train_rows": int(is_train.sum()), "test_rows": int((~is_train).sum()),
            "image_generation_s": gen_s}


def warm_sources(paths: list[str]) -> float:
    """Read every source image once, so that every method starts with them in page cache."""
    t0 = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    return time.perf_counter() - t0


class Prepared:
    """A method's empty cache, helper processes and what its trials are told about them."""

    def __init__(self, name: str, mdir: Path) -> None:
        shutil.rmtree(mdir, ignore_errors=True)
        mdir.mkdir(parents=True)
        self.name, self.mdir = name, mdir
        self.state: dict[str, Any] = {}
        self.split_state: dict[str, dict[str, Any]] = {}
        self.helpers: list[int] = []
        self.env = dict(os.environ)
        self.cache_roots: list[Path] = [mdir]
        self._impl: Any = None
        self._shared: Any = None
        if name.startswith("tensorstore_cache"):
            self.state = {"cache_dir": str(mdir / "cache")}
        elif name == "no_cache":
            self.cache_roots = []
        elif name == "manager_vectors":
            self._impl = methods.get(name)
            st = self._impl.prepare(mdir, [])
            self._shared = st["shared"]  # the dict lives as long as the driver holds a proxy
            self.state = {"shared": base64.b64encode(pickle.dumps(self._shared)).decode()}
            self.helpers = self._impl.server_pids(st)
            self.env[AUTHKEY_ENV] = bytes(multiprocessing.current_process().authkey).hex()
            self.cache_roots = []
        else:
            self._impl = methods.get(name)
            self.state = self._impl.prepare(mdir, [])
            if name == "hf_datasets":  # one map() cache per table, as the original's two calls
                for split in ("train", "test"):
                    d = Path(self.state["cache_dir"]) / split
                    d.mkdir(parents=True)
                    self.split_state[split] = {"cache_dir": str(d)}

    def disk_bytes(self) -> int | None:
        return dir_bytes(self.mdir) if self.cache_roots else None

    def close(self) -> None:
        self._shared = None
        if self._impl is not None:
            self._impl.teardown()
        shutil.rmtree(self.mdir, ignore_errors=True)  # frees its page cache too


def _base_spec(cfg: Config, tables: dict[str, Any], method: str) -> dict[str, Any]:
    return {"method": method, "seed": cfg.seed, "steps": cfg.steps, "eval_rows": cfg.eval_rows,
            "val_fraction": cfg.val_fraction, "train_table": tables["train_table"],
            "test_table": tables["test_table"]}


def run_method(cfg: Config, run: int, name: str, tables: dict[str, Any],
               storage: str) -> dict[str, Any]:
    """One sweep of ``cfg.trials`` trials of method ``name``, from an empty cache."""
    import optuna

    prep = Prepared(name, cfg.workdir / "methods" / name)
    try:
        warm_s = warm_sources(tables["sources"])
        study = optuna.create_study(study_name=f"{name}-run{run}", storage=storage,
                                    direction="minimize", load_if_exists=True,
                                    sampler=optuna.samplers.TPESampler(seed=cfg.seed))
        for params in CONFIGS[: cfg.trials]:
            study.enqueue_trial(params)
        base = dict(_base_spec(cfg, tables, name), state=prep.state,
                    split_state=prep.split_state)
        fault = cfg.faults.get(name)

        def jobs() -> Iterator[Job]:
            for _ in range(cfg.trials):
                trial = study.ask()
                params = {"lr": trial.suggest_float("lr", *LR_RANGE, log=True),
                          "batch_size": trial.suggest_categorical("batch_size", BATCH_SIZES)}
                spec = dict(base)
                if fault is not None and fault[0] == trial.number:
                    spec["fault"] = fault[1]

                def tell(rec: dict[str, Any], trial: Any = trial) -> None:
                    if rec["status"] == "ok":
                        study.tell(trial, rec["val_rmse"])
                    else:
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)

                yield Job(trial.number, params, spec, tell)

        log(f"run {run}: {name}: {cfg.trials} trials on {cfg.agents} agents")
        res = run_lanes(jobs(), agents=cfg.agents,
                        trial_dir=cfg.workdir / "trials" / f"run{run}" / name,
                        memory=NodeMemory(prep.cache_roots), helpers=prep.helpers,
                        env=prep.env, period_s=cfg.sample_period_s,
                        timeout_s=cfg.trial_timeout_s, log=lambda m: log(f"{name}: {m}"))
        res["disk_bytes"] = prep.disk_bytes()
        res["warm_sources_s"] = warm_s
        states = [t.state.name for t in study.get_trials(deepcopy=False)]
        res["study"] = {"name": study.study_name, "trials": len(states),
                        "complete": states.count("COMPLETE"), "fail": states.count("FAIL")}
        log(f"run {run}: {name}: sweep {res['wall_s']:.1f} s, peak node memory "
            f"{res['peak']['node'] / 2**20:,.0f} MiB")
        return res
    finally:
        prep.close()


def run_baseline(cfg: Config, run: int, tables: dict[str, Any]) -> dict[str, Any]:
    """K trials at once with the same imports and training, on synthetic batches: the
    agents' own memory and start-up, without any image data."""
    base = _base_spec(cfg, tables, "baseline")
    jobs = iter([Job(i, CONFIGS[i % len(CONFIGS)], dict(base)) for i in range(cfg.agents)])
    log(f"run {run}: baseline: {cfg.agents} trials without data")
    return run_lanes(jobs, agents=cfg.agents, trial_dir=cfg.workdir / "trials" / f"run{run}" /
                     "baseline", memory=NodeMemory(), period_s=cfg.sample_period_s,
                     timeout_s=cfg.trial_timeout_s, log=lambda m: log(f"baseline: {m}"))


def parse(argv: list[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=("default", "original"), default="default",
                        help="original: 129,777 train + 52,000 test covers")
    parser.add_argument("--images", type=int, default=None,
                        help=f"unique covers (default {DEFAULT_IMAGES:,}; original: 181,777)")
    parser.add_argument("--agents", type=int, default=4, help="trials running at once (K)")
    parser.add_argument("--trials", type=int, default=8, help="trials per method")
    parser.add_argument("--steps", type=int, default=30,
                        help="training steps per trial, at most one epoch")
    parser.add_argument("--runs", type=int, default=2,
                        help="whole sweeps per method; targets count only beyond their spread")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated subset of: " + ", ".join(METHODS))
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch directory (default: $TMPDIR/tensorstore-cache-sweep)")
    parser.add_argument("--data", type=Path, default=None,
                        help="cover set (default: WORKDIR/data-N-sSEED, generated once)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output directory")
    parser.add_argument("--out", default=None,
                        help="output name (default: sweep; original scale: sweep-original)")
    parser.add_argument("--eval-rows", type=int, default=2048,
                        help="validation and test rows evaluated per trial")
    parser.add_argument("--trial-timeout", type=float, default=3600.0,
                        help="seconds before a trial is stopped and recorded as timed out")
    parser.add_argument("--sample-period", type=float, default=1.0,
                        help="seconds between memory samples")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest RMSE difference between methods for one configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sweep (300 covers, 2 agents, 2 trials, 1 run), for tests")
    parser.add_argument("--inject-fault", action="append", default=[],
                        metavar="METHOD:TRIAL:{kill,raise}",
                        help="make one trial die (SIGKILL) or raise, to test failure records")
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    original = args.scale == "original"
    images = args.images or (ORIGINAL_TRAIN + ORIGINAL_TEST if original else
                             300 if args.quick else DEFAULT_IMAGES)
    train_covers = round(images * ORIGINAL_TRAIN / (ORIGINAL_TRAIN + ORIGINAL_TEST))
    agents, trials, steps, runs = args.agents, args.trials, args.steps, args.runs
    eval_rows, period = args.eval_rows, args.sample_period
    if args.quick:
        agents, trials, steps, runs, eval_rows, period = 2, 2, 4, 1, 64, 0.2
    if agents < 1 or trials < 1 or runs < 1 or steps < 1:
        parser.error("--agents, --trials, --runs and --steps must be at least 1")
    if trials > len(CONFIGS):
        parser.error(f"at most {len(CONFIGS)} trials (the enqueued configurations)")
    faults: dict[str, tuple[int, str]] = {}
    for item in args.inject_fault:
        method, number, kind = [*item.split(":"), "", ""][:3]
        if method not in METHODS or kind not in ("kill", "raise") or not number.isdigit():
            parser.error(f"--inject-fault wants METHOD:TRIAL:kill|raise, got {item!r}")
        faults[method] = (int(number), kind)
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-sweep").resolve()
    data = (args.data or workdir / f"data-{images}-s{args.seed}").resolve()
    out = args.out or ("sweep-original" if original else "sweep")
    return Config(args.scale, images, train_covers, args.seed, agents, trials, steps, runs, names,
                  workdir, data, args.results.resolve(), out, eval_rows, 0.1,
                  args.trial_timeout, period, args.tolerance, faults)


def main(argv: list[str] | None = None) -> int:
    import optuna

    cfg = parse(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.time()
    _report.compile_sources()
    env = _report.environment()
    this_run = run_stamp("benchmarks.sweep", argv, env)
    env["command"] = this_run["command"]
    log(f"covers: {cfg.images:,} in {cfg.data}")
    tables = prepare_tables(cfg)
    for sub in ("methods", "trials"):
        shutil.rmtree(cfg.workdir / sub, ignore_errors=True)
    db = cfg.workdir / "sweep.db"
    db.unlink(missing_ok=True)
    storage = f"sqlite:///{db}"
    runs: list[dict[str, Any]] = []
    for run in range(1, cfg.runs + 1):
        out: dict[str, Any] = {"methods": {}}
        if run == 1:  # the agents' own memory: measured once
            out["baseline"] = run_baseline(cfg, run, tables)
        for name in cfg.methods:
            out["methods"][name] = run_method(cfg, run, name, tables, storage)
        runs.append(out)
    env["wall_s"] = time.time() - started
    env["sizes"] = {k: tables[k] for k in ("train_covers", "test_covers", "train_rows",
                                           "test_rows", "image_generation_s")}
    env["sizes"]["covers"] = cfg.images
    env["sizes"]["vector_bytes"] = cfg.images * ITEM_BYTES
    config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    # as written: paths relative to the checkout or as <data>, <workdir>, <results>
    report = portable(stamp(_sweep_report.build(env, config, runs), this_run), data=cfg.data,
                      workdir=cfg.workdir, results=cfg.results)
    print(_sweep_report.write(report, ResultsFile(cfg.results, cfg.out)))
    log(f"done in {env['wall_s']:.0f} s; results in {cfg.results / cfg.out}.*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
