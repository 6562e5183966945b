"""The benchmarks' verdicts at their edges: a value that passes, one that misses, one that
misses within the runs' spread, and one exactly on the threshold.

The sweep's :func:`judge` decides the README's headline verdict; the main and embedding
benchmarks' targets go through :func:`verdict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

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
