"""The records benchmark: covers, title token ids and ratings, against the peers.

Run ``python -m benchmarks.records [--images N] [--methods a,b]``. It generates the
covers (:mod:`benchmarks.common.make_images`, once per size and seed), writes each cover's
generated title and mean rating next to them (:mod:`benchmarks.records.records_data`), then for
every method (:mod:`benchmarks.records.records_methods`), each phase in a fresh process of the
method's own environment (the peers' virtual environments come from ``make peers``):

- build the store of every record with 2 workers (time, bytes on disk);
- open it and read the first record, map the keys, read records by key for a time
  budget, time random batches of 256 padded records (the same row ids for every method),
  read a sequential epoch;
- 4 reader processes that each opened the store and read every record, alive at once,
  and a baseline process: their private memory (USS) growth;
- open time of a fresh process at several store sizes (synthetic records);
- then every method's build again, and the decode-only floor (the same records computed by
  2 processes, nothing written), in ``--build-rounds`` interleaved rounds: a method's build
  time is the median of its rounds (:mod:`benchmarks.records._records_build`);
- then every method's read phase again, and the opens at every size, in ``--read-rounds``
  and ``--open-rounds`` interleaved rounds: a method's read figures and open times are the
  medians of its rounds (:mod:`benchmarks.records._records_reads`).

Every method's records are checked against the numpy limit's (digests of the records
read by key and of the first batches, and the epoch's sums). A method that is not
installed, raises, is killed or times out is recorded as such and the run goes on.
Writes ``NAME.json`` and ``NAME.md`` into ``benchmarks/results/records/`` (``--out``, default
``records``), rewritten after each method, and prints the table with the targets.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import _report, make_images
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import run_stamp
from benchmarks.records import _records_build, _records_reads, _records_report, records_data
from benchmarks.records._records_procs import Runner
from benchmarks.records.records_methods import DEFAULT, FLOOR, METHODS, VENVS, get

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "records"
DEFAULT_IMAGES = 20_000
DEFAULT_OPEN_SIZES = (5_000, 80_000)
WORKERS = 2


@dataclass
class Config:
    images: int
    seed: int
    workdir: Path
    data: Path
    results: Path
    out: str
    methods: list[str]
    batches: int
    batch_size: int
    lookup_budget_s: float
    open_sizes: list[int]
    open_rounds: int
    readers: int
    timeout_s: float
    venvs: dict[str, str]
    keep: bool
    workers: int = WORKERS
    build_rounds: int = 5
    read_rounds: int = 5


def log(msg: str) -> None:
    print(f"[records {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse(argv: list[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                        help=f"covers, one record each (default {DEFAULT_IMAGES}; 181777 = the "
                        "original script's scale)")
    parser.add_argument("--methods", default=",".join(DEFAULT),
                        help=f"comma-separated (default {','.join(DEFAULT)}; known: "
                        f"{', '.join(METHODS)})")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch directory (default: $TMPDIR/tensorstore-cache-records)")
    parser.add_argument("--data", type=Path, default=None,
                        help="cover directory (default: WORKDIR/data-N-sSEED, reused)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output directory")
    parser.add_argument("--out", default="records", help="writes NAME.json and NAME.md")
    parser.add_argument("--batches", type=int, default=200,
                        help="random batches timed per method (default 200, at least 200 for "
                        "the published figures)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lookup-budget", type=float, default=1.0,
                        help="seconds of records by key per method (default 1)")
    parser.add_argument("--open-sizes", default=",".join(map(str, DEFAULT_OPEN_SIZES)),
                        help="store sizes for open time vs N (default 5000,80000; '' for none)")
    parser.add_argument("--open-rounds", "--open-repeats", type=int, default=5,
                        dest="open_rounds",
                        help="interleaved rounds of every method's fresh-process open at every "
                        "size, whose medians are the open times (default 5)")
    parser.add_argument("--read-rounds", type=int, default=5,
                        help="interleaved rounds of every method's read phase, whose medians "
                        "are the read figures (default 5; 0: each read once)")
    parser.add_argument("--readers", type=int, default=4, help="reader processes (default 4)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds a phase may run before it is stopped and recorded as "
                        "timed out (default 3600)")
    for env, venv in VENVS.items():
        parser.add_argument(f"--{env.replace('_', '-')}-venv", default=str(REPO / venv),
                            help=f"virtual environment of the {env} methods (default {venv})")
    parser.add_argument("--build-rounds", type=int, default=5,
                        help="interleaved rounds of every method's build and of the decode-only "
                        "floor, whose medians are the build times (default 5; 0: each build "
                        "once, no floor)")
    parser.add_argument("--keep", action="store_true", help="keep the stores after measuring")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS or m == FLOOR]
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    if args.batches < 1 or args.batch_size < 1 or args.readers < 1 or args.images < 1:
        parser.error("--images, --batches, --batch-size and --readers must be >= 1")
    if args.build_rounds < 0:
        parser.error(f"--build-rounds must be >= 0, got {args.build_rounds}")
    if args.open_rounds < 1 or args.read_rounds < 0:
        parser.error("--open-rounds must be >= 1 and --read-rounds >= 0")
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-records").resolve()
    data = (args.data or workdir / f"data-{args.images}-s{args.seed}").resolve()
    sizes = [int(s) for s in args.open_sizes.split(",") if s.strip()]
    venvs = {env: str(Path(getattr(args, f"{env}_venv")).resolve()) for env in VENVS}
    return Config(args.images, args.seed, workdir, data, args.results.resolve(), args.out,
                  names, args.batches, args.batch_size, args.lookup_budget, sizes,
                  args.open_rounds, args.readers, args.timeout, venvs, args.keep,
                  build_rounds=args.build_rounds, read_rounds=args.read_rounds)


def cover_records(data: Path) -> tuple[list[str], np.ndarray, int]:
    """Unique cover paths of ``ratings.csv`` (first appearance, absolute), each cover's
    mean rating (float32), and the table's row count."""
    import pandas as pd

    ratings = pd.read_csv(data / make_images.RATINGS, dtype={"isbn": str})
    mean = ratings.groupby("img_path", sort=False)["rating"].mean()
    root = str(data.resolve())
    return ([os.path.join(root, p) for p in mean.index], mean.to_numpy(np.float32),
            len(ratings))


def warm(paths: list[str]) -> None:
    """Read every cover once, so that every build starts with them in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 20):
                pass


def _brief(res: dict[str, Any]) -> dict[str, Any]:
    """A phase's record without the figures that go to the method's record."""
    if res.get("status") != "ok":
        return res
    return {k: res[k] for k in ("status", "import_s", "pid") if k in res}


def bench_method(name: str, cfg: Config, runner: Runner, jobs: dict[str, Any],
                 keys: list[str], reads: dict[str, Any]) -> dict[str, Any]:
    """Build, read, hold and clean up one method; its record. A method that read keeps
    its store for the read rounds: its read job goes to ``reads``."""
    entry = METHODS[name]
    store = cfg.workdir / "stores" / name
    shutil.rmtree(store, ignore_errors=True)
    store.parent.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"summary": get(name).summary, "env": entry.env, "status": "ok",
                           "phases": {}}
    log(f"{name}: build ({cfg.workers} workers)")
    warm(keys)
    base = {"inputs": jobs["inputs"], "out": str(store), "workers": cfg.workers}
    built = runner.run(name, "build", base)
    rec["phases"]["build"] = _brief(built)
    rec.update(python=built.get("python"), versions=built.get("versions"))
    if built["status"] != "ok":
        log(f"{name}: {built['text']}")
        rec.update(status=built["status"], text=built["text"])
        return rec
    rec.update(build_s=built["build_s"], disk_bytes=built["disk_bytes"],
               records=built["records"])
    read_job = {**base, "built": built["built"], "batches": jobs["batches"],
                "lookups": jobs["lookups"], "lookup_budget_s": cfg.lookup_budget_s,
                "epoch_batch": cfg.batch_size}
    log(f"{name}: open, records by key, {cfg.batches} random batches, epoch")
    read = runner.run(name, "read", read_job)
    rec["phases"]["read"] = _brief(read)
    if read["status"] == "ok":
        rec.update({k: v for k, v in read.items() if k not in ("status", "import_s", "pid",
                                                               "python", "versions")})
    else:
        log(f"{name}: reading: {read['text']}")
    log(f"{name}: {cfg.readers} readers and a baseline")
    # what earlier processes left is cleaned once here, never by a reader while others run
    # (MosaicML streaming's cleanup removed the shared memory of a live reader)
    runner.run(name, "cleanup", {"out": str(store)})
    hold = runner.hold_round(name, {**read_job, "concurrent": True}, cfg.readers)
    rec["phases"]["hold"] = hold if hold["status"] != "ok" else {"status": "ok"}
    if hold["status"] == "ok":
        rec["memory"] = {k: v for k, v in hold.items() if k != "status"}
        rec["uss_growth_bytes_4_readers"] = hold["uss_growth_bytes"]
        rec["anon_growth_bytes_4_readers"] = hold["anon_growth_bytes"]
        rec["pss_total_bytes_4_readers"] = hold["pss_total_bytes"]
        rec["uss_growth_per_store"] = hold["uss_growth_bytes"] / max(1, rec["disk_bytes"])
    else:
        log(f"{name}: readers: {hold['text']}")
    clean = runner.run(name, "cleanup", {"out": str(store)})
    rec["phases"]["cleanup"] = clean if clean["status"] != "ok" else {"status": "ok"}
    rec["cleanup"] = {k: v for k, v in clean.items() if k.startswith(("shm", "locks"))}
    if read["status"] == "ok" and cfg.read_rounds:
        reads[name] = {"job": read_job, "first": read}
    elif not cfg.keep:
        shutil.rmtree(store, ignore_errors=True)
    return rec


def build_open_stores(name: str, cfg: Config, runner: Runner,
                      opens: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """Build the synthetic store of every open-time size for one method (kept for the open
    rounds: each store's open job goes to ``opens``); the builds' failures and figures."""
    per: dict[str, Any] = {}
    for n in cfg.open_sizes:
        store = cfg.workdir / "open" / f"{name}-{n}"
        shutil.rmtree(store, ignore_errors=True)
        store.parent.mkdir(parents=True, exist_ok=True)
        log(f"{name}: open-time store of {n:,} synthetic records")
        job = {"synthetic": n, "out": str(store), "workers": cfg.workers}
        built = runner.run(name, "build", job)
        if built["status"] != "ok":
            per[str(n)] = {k: v for k, v in built.items() if k != "log_tail"}
            shutil.rmtree(store, ignore_errors=True)
            break
        per[str(n)] = {"status": "ok", "build_s": built["build_s"],
                       "disk_bytes": built["disk_bytes"]}
        opens[(name, n)] = {**job, "built": built["built"]}
    return per


def _open_rounds(report: dict[str, Any], cfg: Config, runner: Runner,
                 opens: dict[tuple[str, int], dict[str, Any]]) -> None:
    """The open rounds of every kept open-time store, into ``report["open_vs_n"]``; then
    the stores are removed."""
    log(f"opens at {', '.join(f'{n:,}' for n in cfg.open_sizes)} records, {cfg.open_rounds} "
        "interleaved rounds")
    got = _records_reads.open_rounds(runner, opens, cfg.open_rounds, log)
    for name, per in got.items():
        for n, res in per.items():
            report["open_vs_n"].setdefault(name, {}).setdefault(n, {}).update(res)
    for (name, _n), job in opens.items():
        runner.run(name, "cleanup", {"out": job["out"]})
        shutil.rmtree(job["out"], ignore_errors=True)


def _read_rounds(report: dict[str, Any], cfg: Config, runner: Runner,
                 reads: dict[str, Any]) -> None:
    """The read rounds of every kept store: the read figures become their medians; then
    the stores are removed (unless ``--keep``)."""
    log(f"reads, {cfg.read_rounds} interleaved rounds of {', '.join(reads)}")
    report["read_rounds"] = _records_reads.read_rounds(
        runner, {n: r["job"] for n, r in reads.items()},
        {n: r["first"] for n, r in reads.items()}, cfg.read_rounds, log)
    _records_reads.apply(report["methods"], report["read_rounds"])
    for name, r in reads.items():
        runner.run(name, "cleanup", {"out": r["job"]["out"]})
        if not cfg.keep:
            shutil.rmtree(r["job"]["out"], ignore_errors=True)


def _markdown(report: dict[str, Any]) -> str:
    """The tables, with the sections of the rounds of builds and of reads."""
    sections = [*_records_build.markdown(report.get("build_rounds"))[1:],
                *_records_reads.markdown(report.get("read_rounds"))]
    return _records_report.markdown(report) + ("\n".join(sections) + "\n" if sections else "")


def save(report: dict[str, Any], files: ResultsFile, started: float, cfg: Config,
         run: dict[str, Any]) -> str:
    """Write the report as anyone can read it: the run's directories by name, no machine's."""
    report["env"]["wall_s"] = round(time.time() - started, 1)
    _records_report.check_records(report["methods"])
    report["targets"] = {**_records_report.targets(report["methods"], report["open_vs_n"],
                                                   report["config"]["open_sizes"]),
                         **_records_build.targets(report.get("build_rounds"))}
    venvs = {f"{env}_venv": venv for env, venv in cfg.venvs.items()}
    return _report.publish(files, report, _markdown, run, data=cfg.data,
                           workdir=cfg.workdir, results=cfg.results, **venvs)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(argv)
    started = time.time()
    files = ResultsFile(cfg.results, cfg.out)
    _report.compile_sources()
    env = _report.environment()
    run = run_stamp("benchmarks.records", argv, env)
    env["command"] = run["command"]
    log(f"generating {cfg.images:,} covers into {cfg.data}")
    make_images.generate(cfg.data, cfg.images, cfg.seed, quiet=True)
    keys, ratings, rows = cover_records(cfg.data)
    n = len(keys)
    inputs = records_data.write_inputs(cfg.workdir / "inputs", keys, ratings, cfg.seed)
    lengths = records_data.title_lengths(n, cfg.seed)
    rng = np.random.default_rng([cfg.seed, 0xBA7])
    batches = np.stack([rng.choice(n, cfg.batch_size, replace=n < cfg.batch_size)
                        for _ in range(cfg.batches)]).astype(np.int64)
    lookups = rng.integers(0, n, min(4096, max(n, 64))).astype(np.int64)
    jobs = {"inputs": str(inputs), "batches": str(cfg.workdir / "batches.npy"),
            "lookups": str(cfg.workdir / "lookups.npy")}
    np.save(jobs["batches"], batches)
    np.save(jobs["lookups"], lookups)
    env["sizes"] = {"records": n, "images": cfg.images, "ratings_rows": rows,
                    "title_min": int(lengths.min()), "title_max": int(lengths.max()),
                    "title_mean": float(lengths.mean())}
    env["disk_free_bytes"] = shutil.disk_usage(cfg.workdir).free
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    report: dict[str, Any] = {"env": env, "config": config, "methods": {}, "open_vs_n": {},
                              "targets": {}}
    shutil.rmtree(cfg.workdir / "tmp", ignore_errors=True)  # the phases' temporary files
    runner = Runner(REPO, cfg.workdir, {k: Path(v) for k, v in cfg.venvs.items()},
                    cfg.timeout_s)
    reads: dict[str, Any] = {}
    opens: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        for name in cfg.methods:
            t0 = time.time()
            rec = bench_method(name, cfg, runner, jobs, keys, reads)
            report["methods"][name] = rec
            save(report, files, started, cfg, run)
            if rec["status"] == "ok" and cfg.open_sizes:
                report["open_vs_n"][name] = build_open_stores(name, cfg, runner, opens)
            rec["wall_s"] = round(time.time() - t0, 1)
            save(report, files, started, cfg, run)
        built = [m for m, r in report["methods"].items() if r.get("status") == "ok"]
        if cfg.build_rounds and built:
            log(f"builds, {cfg.build_rounds} interleaved rounds of {', '.join(built)} and "
                f"{FLOOR}")
            report["build_rounds"] = _records_build.build_rounds(
                runner, cfg.workdir, built, jobs["inputs"], cfg.workers, cfg.build_rounds, log)
            _records_build.apply(report["methods"], report["build_rounds"])
            save(report, files, started, cfg, run)
        if opens:
            _open_rounds(report, cfg, runner, opens)
            save(report, files, started, cfg, run)
        if reads:
            _read_rounds(report, cfg, runner, reads)
            save(report, files, started, cfg, run)
    except KeyboardInterrupt:
        log(f"interrupted: {files.json} holds the methods measured so far")
        return 130
    text = save(report, files, started, cfg, run)
    print(text)
    log(f"done in {time.time() - started:.0f} s; results in {files.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
