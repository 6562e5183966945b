"""The benchmarks' verdicts at their edges: a value that passes, one that misses, one that
misses within the runs' spread, and one exactly on the threshold.

The sweep's :func:`judge` decides the README's headline verdict; the main and embedding
benchmarks' targets go through :func:`verdict`, and the main benchmark's :func:`targets` are
computed here from the figures of a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from benchmarks.common import _report
from benchmarks.common._report import verdict
from benchmarks.embed import embed
from benchmarks.sweep._sweep_report import judge


@pytest.mark.parametrize(
    ("value", "op", "threshold", "want"),
    [
        (2.5, ">=", 2.0, "PASS"), (1.9, ">=", 2.0, "MISS"), (2.0, ">=", 2.0, "PASS"),
        (1.01, ">", 1.0, "PASS"), (0.9, ">", 1.0, "MISS"), (1.0, ">", 1.0, "MISS"),
        (0.05, "<=", 0.10, "PASS"), (0.11, "<=", 0.10, "MISS"), (0.10, "<=", 0.10, "PASS"),
    ],
)
def test_a_target_passes_misses_and_sits_on_its_threshold(
    value: float, op: str, threshold: float, want: str
) -> None:
    assert verdict(value, op, threshold) == want


def _runs(values: Sequence[float | None], op: str, threshold: float) -> list[dict[str, Any]]:
    return [{"t": {"description": "d", "op": op, "threshold": threshold, "value": v,
                   "note": None}} for v in values]


@pytest.mark.parametrize(
    ("values", "op", "threshold", "want", "margin", "spread"),
    [
        ([0.50, 0.52], "<=", 0.8, "PASS", 0.28, 0.02),
        ([0.70, 0.90], "<=", 0.8, "MISS", -0.10, 0.20),
        ([0.70, 0.79], "<=", 0.8, "MISS (within spread)", 0.01, 0.09),
        ([0.80, 0.80], "<=", 0.8, "MISS (within spread)", 0.0, 0.0),
        ([0.80], "<=", 0.8, "PASS (1 run)", 0.0, None),
        ([0.81], "<=", 0.8, "MISS", -0.01, None),
        ([3.0, 3.1], ">=", 2.0, "PASS", 1.0, 0.1),
        ([2.0, 2.6], ">=", 2.0, "MISS (within spread)", 0.0, 0.6),
        ([1.99, 2.6], ">=", 2.0, "MISS", -0.01, 0.61),
    ],
)
def test_the_sweep_judges_every_run_against_the_spread(
    values: list[float], op: str, threshold: float, want: str, margin: float,
    spread: float | None,
) -> None:
    got = judge(_runs(values, op, threshold))["t"]
    assert got["status"] == want
    assert got["margin"] == pytest.approx(margin)
    assert got["spread"] == (None if spread is None else pytest.approx(spread))
    assert got["values"] == values


def test_the_sweep_says_n_a_when_a_run_lacks_the_value() -> None:
    assert judge(_runs([0.5, None], "<=", 0.8))["t"]["status"] == "n/a"


def _embed_report(per_item_s: float, batched_s: float, limit_s: float,
                  device_limit_s: float) -> dict[str, Any]:
    def ok(**figures: float) -> dict[str, Any]:
        return {"status": "ok", "same_as_model": True, **figures}

    return {"methods": {embed.TSC: ok(build_s=batched_s), embed.PER_ITEM: ok(build_s=per_item_s),
                        embed.HF: ok(build_s=batched_s)},
            "limit": ok(limit_s=limit_s), embed.DEVICE_LIMIT: ok(limit_s=device_limit_s)}


@pytest.mark.parametrize(
    ("figures", "want"),
    [
        ((30.0, 10.0, 10.0, 10.0), ["PASS", "PASS", "PASS"]),   # 3x, 1.0x, 1.0x
        ((19.0, 10.0, 8.0, 8.2), ["MISS", "MISS", "MISS"]),     # 1.9x, 1.25x, 1.22x
        ((20.0, 12.0, 10.0, 10.0), ["MISS", "PASS", "PASS"]),   # 1.667x; exactly 1.2x twice
        ((24.0, 12.0, 10.0, 9.0), ["PASS", "PASS", "MISS"]),    # exactly 2x; 1.2x; 1.333x
    ],
)
def test_the_embedding_targets_at_their_edges(figures: tuple[float, ...], want: list[str]) -> None:
    got = embed.targets(_embed_report(*figures))
    assert [got[key]["status"] for key, *_ in embed.TARGETS] == want


def test_an_embedding_target_of_a_failed_or_wrong_method_is_failed() -> None:
    report = _embed_report(30.0, 10.0, 10.0, 10.0)
    report["methods"][embed.PER_ITEM] = {"status": "failed", "text": "exit code 1"}
    report["methods"][embed.TSC]["same_as_model"] = False
    got = embed.targets(report)
    assert {v["status"] for v in got.values()} == {"FAILED"}
    assert "exit code 1" in got["batched_vs_per_item"]["reason"]
    assert "other embeddings" in got["batched_vs_limit"]["reason"]


def _main_figures(edge: float, worse: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The main benchmark's figures whose every target ratio sits exactly on its threshold
    when ``edge`` and ``worse`` are 1; ``edge`` > 1 moves each ratio to the passing side,
    ``worse`` > 1 to the missing side (every figure is a float the ratio divides exactly)."""
    k = edge / worse
    tsc = {"later_agent_s": 0.5 / k, "lookup_items_per_s": 1.5e6 * k, "batch_items_per_s": 95 * k,
           "uss_growth_bytes_4_agents": 1e8 / k, "disk_bytes": 1e9, "first_agent_s": 90 / k}
    results = {"tensorstore_cache": tsc,
               "torch_save": {"later_agent_s": 10.0},
               "manager_vectors": {"later_agent_s": 10.0, "lookup_items_per_s": 3e4},
               "hf_datasets": {"lookup_items_per_s": 5e4, "first_agent_s": 100.0},
               "raw_memmap": {"batch_items_per_s": 100.0},
               "no_cache": {"first_agent_s": 153.0}}
    opens = {"tensorstore_cache": {"5000": {"open_s": 0.002}, "80000": {"open_s": 0.004 / k}}}
    return results, opens


#: every target of the main benchmark, and where its threshold lies
MAIN_TARGETS = {
    "later_agent_vs_torch_save": 20.0, "later_agent_vs_manager_vectors": 20.0,
    "lookup_vs_manager_vectors": 50.0, "lookup_vs_hf_datasets": 30.0,
    "batch_vs_raw_memmap": 0.95, "memory_4_agents": 0.1, "first_agent_vs_no_cache": 1.7,
    "first_agent_vs_hf_datasets": 0.9, "open_largest_vs_smallest": 2.0,
}


@pytest.mark.parametrize(
    ("edge", "worse", "want"),
    [(1.0, 1.0, "PASS"), (1.25, 1.0, "PASS"), (1.0, 1.25, "MISS"), (1.0, 1.01, "MISS")],
    ids=["exactly on every threshold", "past every threshold", "short of every threshold",
         "just short of every threshold"],
)
def test_the_main_targets_at_their_edges(edge: float, worse: float, want: str) -> None:
    """Each of the main benchmark's targets, computed from the figures of a run, passes on its
    threshold (every one is ``>=`` or ``<=``), past it, and misses short of it. The main
    benchmark's targets compare ratios within one run: there is no spread to miss within."""
    results, opens = _main_figures(edge, worse)
    got = _report.targets(results, opens, [5000, 80000])
    assert set(got) == set(MAIN_TARGETS)
    for key, threshold in MAIN_TARGETS.items():
        assert got[key]["threshold"] == threshold
        assert got[key]["status"] == want, (key, got[key])
        if edge == worse:
            assert got[key]["value"] == threshold, (key, got[key])  # exactly on it


def test_a_main_target_without_its_figures_is_n_a() -> None:
    results, opens = _main_figures(1.0, 1.0)
    del results["raw_memmap"], results["hf_datasets"]
    got = _report.targets(results, opens, [5000, 80000])
    assert {k for k, t in got.items() if t["status"] == "n/a"} == {
        "batch_vs_raw_memmap", "lookup_vs_hf_datasets", "first_agent_vs_hf_datasets"}


def test_first_agents_rounds_rotate_and_their_median_is_the_figure() -> None:
    from benchmarks.common._report import targets
    from benchmarks.run import _first_rounds

    names = ["no_cache", "hf_datasets", "tensorstore_cache"]
    assert [_first_rounds.order(names, r) for r in range(4)] == [
        names, names[1:] + names[:1], names[2:] + names[:2], names]
    results = {n: {"first_agent_s": 9.0, "rounds": {"first": {"status": "ok"}}} for n in names}
    rounds = {"rounds": 3, "orders": [], "methods": {
        "no_cache": {"median_s": 2.4}, "hf_datasets": {"median_s": 2.0},
        "tensorstore_cache": {"median_s": 1.4}}}
    _first_rounds.apply(results, rounds)
    assert [results[n]["first_agent_s"] for n in names] == [2.4, 2.0, 1.4]
    assert results["tensorstore_cache"]["first_agent_once_s"] == 9.0
    got = targets(results, {}, [])
    assert got["first_agent_vs_no_cache"]["value"] == pytest.approx(2.4 / 1.4)
    assert got["first_agent_vs_no_cache"]["status"] == "PASS"  # 1.71x >= 1.7x
    assert got["first_agent_vs_hf_datasets"]["value"] == pytest.approx(0.7)
    _first_rounds.apply(results, rounds)  # again (a resumed run): the single figure stays
    assert results["tensorstore_cache"]["first_agent_once_s"] == 9.0


def test_batch_rounds_median_is_the_batch_figure_and_the_target_compares_it() -> None:
    from benchmarks.common._report import targets
    from benchmarks.run import _batch_rounds

    results = {n: {"batch_items_per_s": 500_000.0, "rounds": {"1": {"status": "ok"}}}
               for n in _batch_rounds.METHODS}
    rounds: dict[str, Any] = {"rounds": 3, "orders": [list(_batch_rounds.METHODS)], "methods": {
        "tensorstore_cache": {"items_per_s": [960e3, 940e3, 990e3], "failures": [],
                              "median_items_per_s": 960e3, "min_items_per_s": 940e3,
                              "max_items_per_s": 990e3},
        "raw_memmap": {"items_per_s": [1e6, None, 1e6], "failures": ["round 2: error: x"],
                       "median_items_per_s": 1e6, "min_items_per_s": 1e6,
                       "max_items_per_s": 1e6}}}
    _batch_rounds.apply(results, rounds)
    assert results["tensorstore_cache"]["batch_items_per_s"] == 960e3
    assert results["tensorstore_cache"]["batch_items_once_per_s"] == 500e3
    got = targets(results, {}, [])["batch_vs_raw_memmap"]
    assert got["value"] == pytest.approx(0.96) and got["status"] == "PASS"
    _batch_rounds.apply(results, rounds)  # again (a resumed run): the single figure stays
    assert results["tensorstore_cache"]["batch_items_once_per_s"] == 500e3
    failed = {n: {"rounds": {"1": {"status": "error", "text": "error: boom"}}}
              for n in _batch_rounds.METHODS}
    _batch_rounds.apply(failed, rounds)  # a method whose own later agent failed keeps it
    assert all("batch_items_per_s" not in rec for rec in failed.values())
    text = "\n".join(_batch_rounds.markdown(rounds))
    assert "| tensorstore_cache | 960k | 940k | 990k | 5% | 960k, 940k, 990k |" in text
    assert "tensorstore_cache / raw_memmap, each round: 0.960, -, 0.990." in text
    assert "- raw_memmap, round 2: error: x" in text
    assert "cache line" not in text  # no offsets recorded: no line
    rounds["methods"]["tensorstore_cache"]["line_offset"] = [0, 0, 0]
    rounds["methods"]["raw_memmap"]["line_offset"] = [48, None, 16]
    text = "\n".join(_batch_rounds.markdown(rounds))
    assert ("cache line (a batch made after the timed ones), each round: tensorstore_cache 0, "
            "0, 0; raw_memmap 48, -, 16.") in text


def test_a_batch_line_offset_is_its_datas_distance_from_a_cache_line() -> None:
    from benchmarks.run._agent import _line_offset

    block = np.zeros(256, np.uint8)
    start = -block.ctypes.data % 64
    assert _line_offset(block[start:]) == 0
    assert _line_offset(block[start + 16:]) == 16
    assert _line_offset([1, 2]) is None
