"""The embedding benchmark: a seeded CNN over every cover, batched, against the alternatives.

Run ``python -m benchmarks.embed [--images N] [--methods a,b] [--threads T]``. It
generates the covers (:mod:`benchmarks.common.make_images`, once per size and seed), then,
each phase in a fresh process:

- the limit: ``prepare`` alone (decoding every cover to 64x64 with ``--workers``
  processes) and the model's forward alone (every batch of already decoded covers,
  in one process); the limit is their sum. The forward pass is timed again as a
  device worker runs it (OpenMP's threads waiting passively, glibc's allocator
  keeping the memory it frees), which makes the model itself faster: the limit
  with it is a second, stricter target;
- for every method, the build of all embeddings (time, and the peak RSS of every
  process taking part: the builder and each worker it started), then a later
  process's time to all embeddings (the cache being there).

Methods (:mod:`benchmarks.embed.embed_model` has the model and the decoding):

``tensorstore_cache``
    ``tsc.cached(paths, loader=CoverEmbed(prepare=decode, batch_size=256,
    devices=["cpu"]), workers=W)``: decoding in the CPU workers, the model in one
    device worker;
``hf_datasets``
    ``Dataset.from_dict({"path": paths}).map(fn, batched=True, batch_size=256,
    num_proc=W)``, ``fn`` decoding and embedding a batch; a later process's call
    loads the map's cache files;
``per_item``
    ``tsc.cached(paths, loader=PerItem(), workers=W)``: today's per-item loader, one
    cover per call (decode and model), a model per worker.

``--threads`` sets torch's threads in every process that runs the model (default:
torch's own default). ``--rounds`` (default 3) runs all of it again, round after round;
the figures and targets are the median round's, and every round's is reported. Every
method's embeddings are checked against the model called directly. Writes ``NAME.json``
and ``NAME.md`` into ``benchmarks/results/embed/`` (``--out``, default ``embed``) with the
targets: the batched build at least 2x faster than the per-item loader, at most 1.2x the
limit, and at most 1.2x the limit with the forward pass run as a device worker runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import _report, make_images
from benchmarks.common._memory import gb, sample
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import run_stamp

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "embed"
METHODS = ("tensorstore_cache", "hf_datasets", "per_item")
DEFAULT_IMAGES = 20_000
TSC, HF, PER_ITEM = METHODS
#: The limit with the forward pass run as in a device worker (its environment, its allocator).
DEVICE_LIMIT = "limit_as_device_worker"
#: The targets: (key, description, numerator, denominator, op, threshold).
TARGETS = (
    ("batched_vs_per_item", f"build time: {PER_ITEM} / {TSC}", (PER_ITEM, "build_s"),
     (TSC, "build_s"), ">=", 2.0),
    ("batched_vs_limit", f"build time: {TSC} / the limit (prepare alone + forward alone)",
     (TSC, "build_s"), ("limit", "limit_s"), "<=", 1.2),
    ("batched_vs_limit_as_device_worker", f"build time: {TSC} / the limit with the forward "
     "pass run as a device worker runs it", (TSC, "build_s"), (DEVICE_LIMIT, "limit_s"), "<=",
     1.2),
)
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def log(msg: str) -> None:
    print(f"[embed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- in a phase's process ------------------------------------------------------------


class PeakMemory:
    """The peak RSS of this process and of every process it starts, sampled in a thread."""

    def __init__(self, every_s: float = 0.25) -> None:
        self.every_s = every_s
        self.peaks: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def _take(self) -> None:
        import psutil

        me = psutil.Process()
        try:
            children = me.children(recursive=True)
        except psutil.Error:
            children = []
        for proc in [me, *children]:
            got = sample(proc.pid)
            if got is None:
                continue
            role = "main" if proc.pid == me.pid else _role(proc)
            old = self.peaks.get(proc.pid, (role, 0))[1]
            self.peaks[proc.pid] = (role, max(old, got["peak_rss"]))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._take()

    def report(self) -> list[dict[str, Any]]:
        return [{"role": role, "peak_rss_bytes": peak}
                for _pid, (role, peak) in sorted(self.peaks.items())]


def _role(proc: Any) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:
        return "worker"
    if "resource_tracker" in cmd or "semaphore_tracker" in cmd:
        return "tracker"
    return "worker"


def _paths(data: Path) -> list[str]:
    return sorted(str(p) for p in (data / "images").rglob("*") if p.is_file())


def phase(job: dict[str, Any]) -> dict[str, Any]:
    """Run one phase (in its own process); its figures."""
    from benchmarks.embed.embed_model import decode

    paths = _paths(Path(job["data"]))
    threads, batch, workers = job["threads"], job["batch_size"], job["workers"]
    name, kind = job["method"], job["phase"]
    out: dict[str, Any] = {}
    if name == "limit" and kind == "prepare":
        from concurrent.futures import ProcessPoolExecutor

        with PeakMemory() as mem, ProcessPoolExecutor(workers) as pool:
            t0 = time.perf_counter()
            for _ in pool.map(decode, paths, chunksize=256):
                pass
            out["prepare_s"] = time.perf_counter() - t0
        out["memory"] = mem.report()
        return out
    if name == "limit" and kind == "forward":
        if job.get("device_worker"):  # set up as a device worker is, before torch loads
            from tensorstore_cache.writer.device import keep_freed_memory

            out["mmap_threshold"] = keep_freed_memory()
        from benchmarks.embed.embed_model import _threads, forward, make_model

        _threads(threads)
        items = [decode(p) for p in paths]
        model = make_model()
        forward(model, items[:batch], "cpu")  # warm
        with PeakMemory() as mem:
            t0 = time.perf_counter()
            parts = [forward(model, items[i : i + batch], "cpu")
                     for i in range(0, len(items), batch)]
            out["forward_s"] = time.perf_counter() - t0
        np.save(job["save"], np.concatenate(parts))
        out["memory"] = mem.report()
        return out
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        vectors = _run_method(name, paths, job)
        out["seconds"] = time.perf_counter() - t0
    out["memory"] = mem.report()
    np.save(job["save"], vectors)
    return out


def _run_method(name: str, paths: list[str], job: dict[str, Any]) -> Any:
    """Every cover's embedding by ``name`` (built, or found built), in path order."""
    threads, batch, workers = job["threads"], job["batch_size"], job["workers"]
    if name == HF:
        import datasets

        from benchmarks.embed.embed_model import hf_embed

        datasets.disable_progress_bars()
        ds = datasets.Dataset.from_dict({"path": paths})
        mapped = ds.map(hf_embed, batched=True, batch_size=batch, num_proc=workers,
                        fn_kwargs={"threads": threads}, remove_columns=["path"],
                        cache_file_name=str(Path(job["cache"]) / "emb.arrow"))
        return mapped.with_format("numpy")["emb"][:]
    import tensorstore_cache as tsc
    from benchmarks.embed.embed_model import CoverEmbed, PerItem, decode

    if name == TSC:
        store = tsc.cached(paths, cache_dir=job["cache"], loader=CoverEmbed(
                               threads, prepare=decode, batch_size=batch, devices=["cpu"]),
                           workers=workers, progress=False)
    else:
        store = tsc.cached(paths, cache_dir=job["cache"], loader=PerItem(threads),
                           workers=workers, progress=False)
    return store.stack(paths)


# -- in the coordinator --------------------------------------------------------------


def run_phase(
    job: dict[str, Any], timeout_s: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``job`` in a fresh process (with ``env`` besides this one's environment); its
    figures, or ``status`` and ``text`` if it failed."""
    cmd = [sys.executable, "-m", "benchmarks.embed", "--phase", json.dumps(job)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "text": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        return {"status": "failed", "text": f"exit code {proc.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["status"] = "ok"
    return result


def _peaks(memory: list[dict[str, Any]]) -> dict[str, Any]:
    main = [m["peak_rss_bytes"] for m in memory if m["role"] == "main"]
    workers = [m["peak_rss_bytes"] for m in memory if m["role"] == "worker"]
    return {"main_peak_rss_bytes": main[0] if main else None,
            "worker_peak_rss_bytes": workers,
            "total_peak_rss_bytes": sum(main) + sum(workers)}


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """The targets as ratios within this run: PASS or MISS; FAILED (with ``reason``) where a
    method they need failed or returned other embeddings; ``n/a`` where it was not run."""
    figures = {**report["methods"], "limit": report["limit"]}
    if report.get(DEVICE_LIMIT):
        figures[DEVICE_LIMIT] = report[DEVICE_LIMIT]
    out: dict[str, Any] = {}
    for key, text, (a, fa), (b, fb), op, threshold in TARGETS:
        reasons = [f"{m}: {figures[m].get('text', figures[m].get('status'))}" for m in (a, b)
                   if m in figures and figures[m].get("status") != "ok"]
        reasons += [f"{m} returned other embeddings than the model called directly"
                    for m in (a, b) if figures.get(m, {}).get("same_as_model") is False]
        x, y = figures.get(a, {}).get(fa), figures.get(b, {}).get(fb)
        value = round(x / y, 3) if x is not None and y else None
        if reasons:
            status = "FAILED"
        elif value is None:
            status = "n/a"
            reasons.append(f"not run: {', '.join(m for m in (a, b) if m not in figures)}")
        else:
            status = _report.verdict(value, op, threshold)
        out[key] = _report.target(text, value, op, threshold, status, reasons)
    return out


def markdown(report: dict[str, Any]) -> str:
    """The report's tables."""
    cfg, env = report["config"], report["env"]
    lines = [
        "# Embeddings of the covers: a seeded 4-conv CNN, 64x64 in, 128 floats out",
        "",
        f"`{env.get('command', '')}`: {cfg['images']:,} covers, batch {cfg['batch_size']}, "
        f"{cfg['workers']} workers, torch threads: {cfg['threads'] or 'default'}; "
        f"{env.get('cpu', '?')}, {env.get('cores', '?')} cores; "
        f"{_rounds_text(cfg.get('rounds', 1))}.",
        "",
        "| method | build (s) | items/s | later process, all embeddings (s) | peak RSS: main "
        "| peak RSS: each worker | same as the model |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, m in report["methods"].items():
        if m.get("status") != "ok":
            lines.append(f"| {name} | {m.get('status')}: {m.get('text', '')[:80]} | | | | | |")
            continue
        workers = ", ".join(gb(b) for b in m["build_memory"]["worker_peak_rss_bytes"])
        lines.append(
            f"| {name} | {m['build_s']:.1f}{_rounds(m.get('build_s_rounds'), 1)} "
            f"| {m['items_per_s']:.0f} | {m.get('later_s', 0):.2f}"
            f"{_rounds(m.get('later_s_rounds'), 2)} "
            f"| {gb(m['build_memory']['main_peak_rss_bytes'] or 0)} | {workers or '-'} | "
            f"{m.get('same_as_model')} |"
        )
    lim = report["limit"]
    if lim.get("status") == "ok":
        lines += ["", f"The limit: prepare alone {lim['prepare_s']:.1f} s ({cfg['workers']} "
                  f"processes) + forward alone {lim['forward_s']:.1f} s = "
                  f"{lim['limit_s']:.1f} s{_rounds(lim.get('limit_s_rounds'), 1, ' (rounds: ')}."]
    dev = report.get(DEVICE_LIMIT) or {}
    if dev.get("status") == "ok":
        settings = ", ".join(f"`{k}={v}`" for k, v in sorted(dev["env"].items()))
        kept = (f"glibc's allocator keeping freed blocks up to {dev['mmap_threshold'] >> 20} MiB"
                if dev.get("mmap_threshold") else "the allocator as it was")
        settings = settings or "no variable set"
        lines += ["", f"The forward pass alone as a device worker runs it ({settings}; {kept}):"
                  f" {dev['forward_s']:.1f} s; the limit with it: {dev['limit_s']:.1f} s"
                  f"{_rounds(dev.get('limit_s_rounds'), 1, ' (rounds: ')}."]
    elif dev:
        lines += ["", f"The forward pass as a device worker runs it: {dev.get('status')}: "
                  f"{dev.get('text', '')}"]
    lines += ["", "| target | value | op | threshold | status |", "|---|---:|---|---:|---|"]
    for key, t in report["targets"].items():
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        why = f" ({t['reason']})" if t.get("reason") else ""
        lines.append(f"| {key}: {t['description']} | {value} | {t['op']} | {t['threshold']} "
                     f"| {t['status']}{why} |")
    return "\n".join(lines) + "\n"


def _limit_round(base: dict[str, Any], direct: Path, workdir: Path, timeout_s: float,
                 of: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One round of the limit's phases, and of the forward pass as a device worker runs it
    (its environment and allocator, :mod:`tensorstore_cache.writer.device`): the limit, and
    the limit with that forward pass."""
    from tensorstore_cache.writer.device import device_environment

    log(f"the limit: prepare alone{of}")
    prep = run_phase({**base, "method": "limit", "phase": "prepare"}, timeout_s)
    log(f"the limit: forward alone{of}")
    fwd = run_phase({**base, "method": "limit", "phase": "forward", "save": str(direct)},
                    timeout_s)
    log(f"the forward pass alone, as a device worker runs it{of}")
    env = device_environment(os.environ)
    fwd_dev = run_phase({**base, "method": "limit", "phase": "forward", "device_worker": True,
                         "save": str(workdir / "direct-device-worker.npy")}, timeout_s, env=env)
    if prep["status"] != "ok":
        return prep, prep
    limits = []
    for each in (fwd, fwd_dev):
        if each["status"] != "ok":
            limits.append(each)
            continue
        limits.append({"status": "ok", "prepare_s": round(prep["prepare_s"], 3),
                       "forward_s": round(each["forward_s"], 3),
                       "limit_s": round(prep["prepare_s"] + each["forward_s"], 3)})
    if limits[1]["status"] == "ok":
        limits[1].update(env=env, mmap_threshold=fwd_dev.get("mmap_threshold", 0))
    return limits[0], limits[1]


def _median_round(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The round whose ``key`` is the median (of an even number, the greater of the two)."""
    return sorted(rounds, key=lambda r: r[key])[len(rounds) // 2]


def _median_limit(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round's limit (its parts), with every round's limit and parts; the first
    failure if a round failed."""
    bad = [r for r in rounds if r["status"] != "ok"]
    if bad:
        return bad[0]
    out = dict(_median_round(rounds, "limit_s"))
    for key in ("limit_s", "prepare_s", "forward_s"):
        out[f"{key}_rounds"] = [r[key] for r in rounds]
    return out


def _method_round(name: str, base: dict[str, Any], workdir: Path, n: int, reference: Any,
                  timeout_s: float, of: str) -> dict[str, Any]:
    """One round of ``name``: its build into an empty cache, then a later process's read."""
    cache = workdir / "caches" / name
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    vectors = workdir / f"{name}.npy"
    job = {**base, "method": name, "cache": str(cache), "save": str(vectors)}
    log(f"{name}: build{of}")
    built = run_phase({**job, "phase": "build"}, timeout_s)
    if built["status"] != "ok":
        log(f"{name}: {built['text']}")
        return built
    rec: dict[str, Any] = {"status": "ok", "build_s": round(built["seconds"], 3),
                           "items_per_s": round(n / built["seconds"], 1),
                           "build_memory": _peaks(built["memory"])}
    got = np.load(vectors)
    if reference is not None:
        rec["same_as_model"] = bool(got.shape == reference.shape and
                                    np.allclose(got, reference, rtol=TOLERANCE["rtol"],
                                                atol=TOLERANCE["atol"]))
    log(f"{name}: a later process{of}")
    later = run_phase({**job, "phase": "later"}, timeout_s)
    if later["status"] == "ok":
        rec["later_s"] = round(later["seconds"], 3)
        rec["later_memory"] = _peaks(later["memory"])
        rec["later_same"] = bool(np.array_equal(np.load(vectors), got))
    else:
        rec["later"] = later
    shutil.rmtree(cache, ignore_errors=True)
    return rec


def _median_method(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round of a method (its build time's), with every round's build and later
    times; the failure if its last round failed. Its embeddings are the model's only if they
    were in every round."""
    if rounds[-1]["status"] != "ok":
        return rounds[-1]
    out = dict(_median_round(rounds, "build_s"))
    out["build_s_rounds"] = [r["build_s"] for r in rounds]
    out["later_s_rounds"] = [r.get("later_s") for r in rounds]
    for key in ("same_as_model", "later_same"):  # of the rounds that could tell
        if any(key in r for r in rounds):
            out[key] = all(r[key] for r in rounds if key in r)
    return out


def _rounds_text(rounds: int) -> str:
    """What the figures of ``rounds`` rounds are, in words."""
    if rounds == 1:
        return "one round"
    return (f"{rounds} rounds, one after the other: the median round's figures (each "
            "round's in parentheses)")


def _rounds(values: list[Any] | None, digits: int, opening: str = " (") -> str:
    """Every round's figure, in parentheses, if there were several."""
    if not values or len(values) < 2:
        return ""
    return opening + ", ".join("-" if v is None else f"{v:.{digits}f}" for v in values) + ")"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                        help=f"covers (default {DEFAULT_IMAGES})")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated (default and known: {','.join(METHODS)})")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="CPU processes (default 2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads in every process that runs the model (default: "
                        "torch's default)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch directory (default: $TMPDIR/tensorstore-cache-embed)")
    parser.add_argument("--data", type=Path, default=None,
                        help="cover directory (default: WORKDIR/data-N-sSEED, reused)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output directory")
    parser.add_argument("--out", default="embed", help="writes NAME.json and NAME.md")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds a phase may run (default 3600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every phase, one after the other; the figures are the "
                        "median round's (default 3)")
    parser.add_argument("--phase", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    if min(args.images, args.batch_size, args.workers, args.rounds) < 1:
        parser.error("--images, --batch-size, --workers and --rounds must be >= 1")
    args.methods = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.phase is not None:
        print(json.dumps(phase(json.loads(args.phase))))
        return 0
    started = time.time()
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-embed").resolve()
    data = (args.data or workdir / f"data-{args.images}-s{args.seed}").resolve()
    results = args.results.resolve()
    files = ResultsFile(results, args.out)
    _report.compile_sources()
    env = _report.environment()
    run = run_stamp("benchmarks.embed", argv, env)
    env["command"] = run["command"]
    log(f"generating {args.images:,} covers into {data}")
    make_images.generate(data, args.images, args.seed, quiet=True)
    n = len(_paths(data))
    config = {"images": n, "batch_size": args.batch_size, "workers": args.workers,
              "threads": args.threads, "methods": args.methods, "seed": args.seed,
              "rounds": args.rounds, "workdir": str(workdir), "data": str(data)}
    report: dict[str, Any] = {"env": env, "config": config, "limit": {}, DEVICE_LIMIT: {},
                              "methods": {}, "targets": {}}
    base = {"data": str(data), "threads": args.threads, "batch_size": args.batch_size,
            "workers": args.workers}

    def save() -> str:
        report["env"]["wall_s"] = round(time.time() - started, 1)
        report["targets"] = targets(report)
        return _report.publish(files, report, markdown, run, data=data, workdir=workdir,
                               results=results)

    direct = workdir / "direct.npy"
    limits: list[dict[str, Any]] = []
    device_limits: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.methods}
    reference: Any = None
    for r in range(args.rounds):
        of = f" (round {r + 1} of {args.rounds})" if args.rounds > 1 else ""
        limit, device_limit = _limit_round(base, direct, workdir, args.timeout, of)
        limits.append(limit)
        device_limits.append(device_limit)
        report["limit"] = _median_limit(limits)
        report[DEVICE_LIMIT] = _median_limit(device_limits)
        save()
        if reference is None and direct.exists():
            reference = np.load(direct)
        for name in args.methods:
            if runs[name] and runs[name][-1]["status"] != "ok":
                continue  # it failed: not again
            runs[name].append(_method_round(name, base, workdir, n, reference, args.timeout, of))
            report["methods"][name] = _median_method(runs[name])
            save()
    text = save()
    print(text)
    log(f"done in {time.time() - started:.0f} s; results in {files.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
