"""What copied sources cost with ``cached(remote=...)``: the content hashes a build records, and
the first call on a node whose sources are copies.

Run ``python -m benchmarks.cluster --images 20000 --build-images 3000``. Writes
``benchmarks/results/cluster/latest.{json,md}``.

build     a local ``cached()`` build of ``--build-images`` covers with
          ``identity="stat"`` (what a node-local cache records) and with
          ``identity="content"`` (what a namespace shared through ``remote=`` records:
          the stat and a content hash of every source), alternated ``--rounds`` times,
          each into a fresh cache directory; and one hash pass over the covers alone.
copied    node A builds ``--images`` covers into a shared-directory remote (the
          rebuild a node pays when it cannot reuse the cluster's vectors); the covers
          are then replaced by a copy of themselves at the same paths (new files, new
          mtimes, the same bytes), and node B (its own cache directory) calls
          ``cached()`` on them twice: the first call reads every source once to compare
          its hash, the second only stats. The source reads are counted.

The page cache is warm for every source read here (the covers were just written or
copied): on a node whose copy is cold, the first call reads each file from disk once,
as the rebuild would too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tensorstore_cache as tsc
from benchmarks.common._report import compile_sources, environment, publish
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import run_stamp
from benchmarks.common.make_images import generate
from tensorstore_cache.fs import hash_many, sources

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cluster"


def _covers(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "images").rglob("*") if p.is_file())


def _timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _build(paths: list[str], cache: Path, identity: str, remote: str | None = None) -> None:
    tsc.cached(paths, cache_dir=cache, identity=identity, remote=remote,  # type: ignore[arg-type]
               progress=False).close()


def measure_build(paths: list[str], work: Path, rounds: int) -> dict[str, Any]:
    """Local builds with and without a content hash of every source, alternated."""
    runs: dict[str, list[float]] = {"stat": [], "content": []}
    for r in range(rounds):
        for identity in ("stat", "content") if r % 2 == 0 else ("content", "stat"):
            cache = work / f"build-{identity}-{r}"
            runs[identity].append(_timed(
                lambda cache=cache, identity=identity: _build(paths, cache, identity)))
            shutil.rmtree(cache)
    hashing = _timed(lambda: hash_many(paths))
    best = {k: min(v) for k, v in runs.items()}
    return {"images": len(paths), "runs_s": runs, "best_s": best, "hash_pass_s": hashing,
            "extra_s": best["content"] - best["stat"],
            "extra_ratio": best["content"] / best["stat"]}


@contextlib.contextmanager
def _counting_reads() -> Iterator[list[int]]:
    """Count the sources read whole to compare their hash (in this process)."""
    reads = [0]
    original = sources.hash_file

    def counted(key: str) -> int:
        reads[0] += 1
        return original(key)

    sources.hash_file = counted
    try:
        yield reads
    finally:
        sources.hash_file = original


def _recopy(data: Path) -> None:
    """Replace every cover by a copy of itself (new inode, new mtime, same bytes), dated an
    hour ago (not racily recent)."""
    moved = data.with_name(data.name + "-original")
    data.rename(moved)
    shutil.copytree(moved, data, copy_function=shutil.copyfile)
    shutil.rmtree(moved)
    past = time.time() - 3600
    for p in data.rglob("*"):
        if p.is_file():
            os.utime(p, (past, past))


def measure_copied(paths: list[str], data: Path, work: Path) -> dict[str, Any]:
    """Node A builds into the remote; node B, on copies, calls twice."""
    remote = work / "remote"
    remote.mkdir()
    rebuild = _timed(lambda: _build(paths, work / "node-a", "stat", str(remote)))
    _recopy(data)
    with _counting_reads() as reads:
        first = _timed(lambda: _build(paths, work / "node-b", "stat", str(remote)))
        first_reads = reads[0]
        second = _timed(lambda: _build(paths, work / "node-b", "stat", str(remote)))
    return {"images": len(paths), "rebuild_s": rebuild, "first_call_s": first,
            "first_call_source_reads": first_reads, "second_call_s": second,
            "second_call_source_reads": reads[0] - first_reads,
            "first_over_rebuild": first / rebuild}


def render(report: dict[str, Any]) -> str:
    b, c = report["build"], report["copied"]
    load = ", ".join(f"{x:.1f}" for x in report["env"]["loadavg_at_start"] or [])
    return "\n".join([
        "# Copied sources with cached(remote=...)", "",
        f"Load average at start: {load}; wall {report['env']['wall_s']:.0f} s.", "",
        f"## Recording a content hash of every source ({b['images']:,} covers, local build)",
        "", "| build | best of runs | runs |", "|---|---|---|",
        f"| identity=\"stat\" (stat only) | {b['best_s']['stat']:.1f} s | "
        f"{', '.join(f'{x:.1f}' for x in b['runs_s']['stat'])} |",
        f"| identity=\"content\" (stat + XXH3-64 of every source, as remote= records) | "
        f"{b['best_s']['content']:.1f} s | "
        f"{', '.join(f'{x:.1f}' for x in b['runs_s']['content'])} |",
        "", f"Extra: {b['extra_s']:+.1f} s ({b['extra_ratio']:.2f}x); a hash pass over the "
        f"covers alone (page cache warm): {b['hash_pass_s']:.2f} s.", "",
        f"## A node whose sources are copies ({c['images']:,} covers)", "",
        "| call | time | sources read |", "|---|---|---|",
        f"| rebuild (node A computes every vector, remote= on a shared directory) | "
        f"{c['rebuild_s']:.1f} s | - |",
        f"| node B, first call (fetch, then compare each copy's hash) | {c['first_call_s']:.1f} s"
        f" | {c['first_call_source_reads']:,} |",
        f"| node B, second call (stat only) | {c['second_call_s']:.2f} s | "
        f"{c['second_call_source_reads']:,} |",
        "", f"First call / rebuild: {c['first_over_rebuild']:.3f}.", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--build-images", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", default=None, help="scratch directory (default: a new one)")
    parser.add_argument("--out", default="latest", help="results name")
    parser.add_argument("--results", default=str(RESULTS), help="results directory")
    args = parser.parse_args(argv)
    compile_sources()
    env = environment()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tsc-cluster-", dir=args.work) as scratch:
        work = Path(scratch)
        small = work / "small"
        generate(small, args.build_images, seed=1, quiet=True)
        build = measure_build(_covers(small), work, args.rounds)
        shutil.rmtree(small)
        data = work / "data"
        generate(data, args.images, seed=0, quiet=True)
        copied = measure_copied(_covers(data), data, work)
    env["wall_s"] = time.perf_counter() - start
    report = {"env": env, "config": vars(args), "build": build, "copied": copied}
    print(publish(ResultsFile(Path(args.results), args.out), report, render,
                  run_stamp("benchmarks.cluster", argv, env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
