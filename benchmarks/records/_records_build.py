"""The builds again, in interleaved rounds, beside the decode-only floor; their targets.

Each method's build is measured once with its other phases (:func:`records.bench_method`),
between other methods' runs. :func:`build_rounds` builds again, ``--build-rounds`` times,
every method that built and the decode-only floor (:mod:`.records_methods.floor`: the
same records computed by 2 processes, nothing written), round after round, each round in a
rotated order (:mod:`benchmarks.common._interleave`), each build in a fresh process of the
method's environment into an empty directory, the covers in the page cache. A method's
``build_s`` becomes the median of its rounds (the single build is kept as
``build_once_s``). The targets: ``tensorstore_cache``'s build at most the fastest peer's,
and at most 1.15x the floor.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from benchmarks.common._interleave import order, spread, summary
from benchmarks.common._report import ratio, seconds, target, verdict
from benchmarks.records._records_procs import Runner
from benchmarks.records.records_methods import FLOOR, PEERS

__all__ = ["apply", "build_rounds", "markdown", "targets"]

TSC = "tensorstore_cache"
#: the targets' thresholds: the build over the fastest peer's, over the floor
VS_PEERS, VS_FLOOR = 1.0, 1.15


def _warm(inputs: str) -> None:
    """Read every cover once (each build starts with them in the page cache)."""
    from benchmarks.records.records_data import read_keys

    for p in read_keys(inputs):
        with open(p, "rb") as f:
            while f.read(1 << 20):
                pass


def build_rounds(runner: Runner, workdir: Path, names: list[str], inputs: str, workers: int,
                 rounds: int, log: Any) -> dict[str, Any]:
    """``rounds`` rounds of every method's build and of the floor, interleaved.

    Returns ``{"rounds": R, "orders": [[name, ...] per round], "methods": {name: {"s":
    [seconds or None per round], "failures": [text, ...], "median_s", "min_s", "max_s"}}}``.
    """
    everyone = [*names, FLOOR]
    out: dict[str, Any] = {"rounds": rounds, "orders": [],
                           "methods": {n: {"s": [], "failures": []} for n in everyone}}
    for r in range(rounds):
        ordered = order(everyone, r)
        out["orders"].append(ordered)
        _warm(inputs)
        for name in ordered:
            store = workdir / "build-rounds" / name
            shutil.rmtree(store, ignore_errors=True)
            store.parent.mkdir(parents=True, exist_ok=True)
            res = runner.run(name, "build", {"inputs": inputs, "out": str(store),
                                             "workers": workers})
            runner.run(name, "cleanup", {"out": str(store)})
            shutil.rmtree(store, ignore_errors=True)
            per = out["methods"][name]
            if res["status"] == "ok":
                per["s"].append(res["build_s"])
                log(f"{name}: build, round {r + 1}/{rounds}: {res['build_s']:.2f} s")
            else:
                per["s"].append(None)
                per["failures"].append(f"round {r + 1}: {res.get('text', res['status'])}")
                log(f"{name}: build, round {r + 1}: {res.get('text', res['status'])}")
    for per in out["methods"].values():
        per.update(summary(per["s"]))
    return out


def apply(methods: dict[str, Any], rounds: dict[str, Any] | None) -> None:
    """Make each method's ``build_s`` the median of its rounds (its single build kept as
    ``build_once_s``)."""
    for name, per in (rounds or {}).get("methods", {}).items():
        rec = methods.get(name)
        if rec is None or per.get("median_s") is None:
            continue
        if "build_once_s" not in rec:
            rec["build_once_s"] = rec.get("build_s")
        rec["build_s"] = per["median_s"]


def targets(rounds: dict[str, Any] | None) -> dict[str, Any]:
    """The build's targets, from the medians of the rounds (none without rounds)."""
    per = (rounds or {}).get("methods", {})
    if TSC not in per:
        return {}
    tsc = per[TSC].get("median_s")
    peers = {p: per[p]["median_s"] for p in PEERS if per.get(p, {}).get("median_s")}
    fastest = min(peers, key=lambda p: peers[p]) if peers else None
    floor = per.get(FLOOR, {}).get("median_s")
    n = rounds["rounds"] if rounds else 0
    out: dict[str, Any] = {}
    for key, text, value, threshold, missing in (
        ("build_vs_fastest_peer",
         f"build, median of {n} rounds: {TSC} / the fastest peer's ({fastest or '-'})",
         ratio(tsc, peers.get(fastest) if fastest else None), VS_PEERS,
         "no peer built" if not peers else None),
        ("build_vs_decode_floor",
         f"build, median of {n} rounds: {TSC} / the decode-only floor (2 processes, "
         "nothing written)", ratio(tsc, floor), VS_FLOOR,
         "the floor was not measured" if floor is None else None),
    ):
        reasons = [f"{TSC}: {t}" for t in per[TSC].get("failures", [])] if tsc is None else []
        if missing:
            reasons.append(missing)
        status = verdict(value, "<=", threshold) if value is not None else (
            "FAILED" if tsc is None else "n/a")
        out[key] = target(text, value, "<=", threshold, status, reasons)
    return out


def markdown(rounds: dict[str, Any] | None) -> list[str]:
    """The section of the rounds: each build's median, spread and rounds, and the floor."""
    if not rounds or not rounds.get("methods"):
        return []
    per_method = rounds["methods"]
    floor = per_method.get(FLOOR, {}).get("median_s")
    lines = ["", f"## Builds, {rounds['rounds']} interleaved rounds", "",
             "Every method's build again, and the decode-only floor (the same records computed "
             "by 2 processes, nothing written), round after round, each round in a rotated "
             "order (round 1: " + ", ".join(rounds["orders"][0] if rounds["orders"] else [])
             + "); each build in a fresh process, into an empty directory, the covers in the "
             "page cache.", "",
             "| method | median s | min s | max s | spread | each round s | / floor |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for name, per in per_method.items():
        each = ", ".join("-" if s is None else f"{s:.2f}" for s in per["s"])
        over = ratio(per.get("median_s"), floor)
        lines.append(f"| {name} | {seconds(per.get('median_s'))} | {seconds(per.get('min_s'))} "
                     f"| {seconds(per.get('max_s'))} | {spread(per)} | {each} "
                     f"| {'-' if over is None else f'{over:.2f}x'} |")
    for name, per in per_method.items():
        for text in per.get("failures", []):
            lines.append(f"- {name}, {text}".replace("|", "/"))
    return lines
