"""The benchmark runs end to end and reports every figure; its image generator is sound.

The end-to-end test runs ``python -m benchmarks.run --quick`` (200 covers, agents
started by a forkserver) in a subprocess, into temporary directories.
"""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import make_images
from benchmarks.methods import METHODS

for _module in ("torch", "pandas", "datasets", "zarr", "psutil", "matplotlib"):
    pytest.importorskip(_module)  # the benchmark's extra dependencies

REPO = Path(__file__).resolve().parents[1]

REQUIRED = (
    "first_agent_s",
    "later_agent_s",
    "open_s",
    "lookup_items_per_s",
    "batch_items_per_s",
    "dataloader_epoch_s",
    "uss_total_bytes_4_agents",
    "pss_total_bytes_4_agents",
    "disk_bytes",
)
CACHES = ("torch_save", "hf_datasets", "zarr_api", "tensorstore_cache", "raw_memmap")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("bench")
    work, results = root / "work", root / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--workdir", str(work),
         "--results", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return work, results, proc.stdout


@pytest.mark.timeout(360)
def test_report_has_every_method_and_figure(quick_run: tuple[Path, Path, str]) -> None:
    _work, results, stdout = quick_run
    report = json.loads((results / "latest.json").read_text())
    assert {"env", "methods", "open_vs_n", "targets"} <= set(report)
    assert list(report["methods"]) == list(METHODS)
    for name, rec in report["methods"].items():
        missing = [k for k in REQUIRED if k not in rec]
        assert not missing, f"{name} lacks {missing}"
        for key in ("first_agent_s", "later_agent_s", "lookup_items_per_s",
                    "batch_items_per_s", "dataloader_epoch_s", "uss_total_bytes_4_agents",
                    "pss_total_bytes_4_agents"):
            assert isinstance(rec[key], (int, float)) and rec[key] > 0, (name, key, rec[key])
        assert rec["dataloader_items"] == report["env"]["sizes"]["unique_paths"], name
        assert sorted(rec["memory"], key=int) == ["1", "2", "4"], name
        assert len(rec["memory"]["4"]["agents_uss_bytes"]) == 4, name
        assert list(rec["rounds"]) == ["first", "1", "2", "4"], name
        assert {r["status"] for r in rec["rounds"].values()} == {"ok"}, (name, rec["rounds"])
        assert rec["rounds"]["4"]["oom_score_adj"] == [1000] * 5, name  # 4 agents + baseline
        assert "need_bytes" in rec["rounds"]["4"]["guard"], name
    for name in CACHES:
        rec = report["methods"][name]
        assert rec["first_agent_hit"] is False, f"{name}: the first agent found a cache"
        assert rec["later_agent_hit"] is True, f"{name}: the later agent missed its cache"
        assert rec["open_s"] > 0 and rec["disk_bytes"] > 0, name
        sizes = report["open_vs_n"][name]
        assert len(sizes) == 3 and all(v["open_s"] > 0 and v["hit"] for v in sizes.values())
    for name in ("no_cache", "manager_pil", "manager_vectors"):
        assert report["methods"][name]["disk_bytes"] is None
    env = report["env"]
    assert env["cores"] >= 1 and env["ram_bytes"] > 0 and env["cpu"] and env["python"]
    for pkg in ("numpy", "torch", "zarr", "datasets"):
        assert env["versions"][pkg], pkg
    assert len(report["targets"]) == 9
    assert {t["status"] for t in report["targets"].values()} <= {"PASS", "MISS", "n/a"}
    table = (results / "latest.md").read_text()
    assert table.strip() in stdout
    assert "## Failures" not in table
    for name in METHODS:
        assert f"| {name} |" in table
    assert "weights_only=False" in table


@pytest.mark.timeout(360)
def test_every_method_returns_the_decoded_vectors(quick_run: tuple[Path, Path, str]) -> None:
    work, results, _ = quick_run
    report = json.loads((results / "latest.json").read_text())
    assert all(rec["vectors_equal_no_cache"] is True for rec in report["methods"].values())
    # and directly: tensorstore_cache's first (building) and later (opening) agents
    # gathered exactly what decoding every image gives
    ref = np.load(work / "verify" / "no_cache-first.npy")
    assert ref.shape == (report["env"]["sizes"]["unique_paths"], 3, 32, 32)
    assert ref.dtype == np.float32 and ref.min() >= 0.0 and ref.max() <= 1.0 and ref.std() > 0.05
    for stage in ("first", "later"):
        got = np.load(work / "verify" / f"tensorstore_cache-{stage}.npy")
        np.testing.assert_array_equal(got, ref)


@pytest.mark.timeout(360)
def test_plots_are_written(quick_run: tuple[Path, Path, str]) -> None:
    _work, results, _ = quick_run
    for name in ("time_to_vectors.png", "memory_vs_agents.png", "open_vs_n.png"):
        data = (results / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, name


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != make_images.MANIFEST:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_make_images_is_deterministic_and_varied(tmp_path: Path) -> None:
    n = 120
    a, b = tmp_path / "a", tmp_path / "b"
    make_images.generate(a, n, seed=3, workers=1, quiet=True)
    make_images.generate(b, n, seed=3, workers=2, quiet=True)
    assert _digest(a) == _digest(b)
    make_images.generate(tmp_path / "c", n, seed=4, workers=1, quiet=True)
    assert _digest(a) != _digest(tmp_path / "c")

    with open(a / make_images.RATINGS, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["user_id", "isbn", "img_path", "rating"]
    refs = Counter(r["img_path"] for r in rows)
    files = {str(p.relative_to(a)) for p in (a / "images").rglob("*.*")}
    assert set(refs) == files and len(files) == n  # every cover referenced, nothing else
    assert min(refs.values()) >= 1 and max(refs.values()) <= make_images.MAX_REFS
    assert len(rows) > n  # covers repeat, as in the ratings data
    assert [r["img_path"] for r in rows] != sorted(r["img_path"] for r in rows)
    assert all(1 <= int(r["rating"]) <= 10 for r in rows)

    modes: Counter[str] = Counter()
    sizes = set()
    for rel in files:
        assert rel.count("/") == 3  # images/xx/yy/name
        with Image.open(a / rel) as img:
            modes[img.mode] += 1
            sizes.add(img.size)
            assert 60 <= img.size[0] <= 120 and 90 <= img.size[1] <= 180
            assert (img.format == "PNG") == rel.endswith(".png")
    assert modes["L"] >= 2 and modes["P"] >= 1 and modes["RGBA"] >= 1
    assert modes["RGB"] > n * 0.9 and len(sizes) > n // 2


def test_make_images_skips_a_complete_set(tmp_path: Path) -> None:
    out = tmp_path / "d"
    make_images.generate(out, 20, seed=0, workers=1, quiet=True)
    manifest = json.loads((out / make_images.MANIFEST).read_text())
    assert manifest["images"] == 20 and manifest["seed"] == 0
    victim = next((out / "images").rglob("*.jpg"))
    victim.unlink()
    make_images.generate(out, 20, seed=0, workers=1, quiet=True)  # same parameters: skipped
    assert not victim.exists()
    assert not make_images.is_complete(out, 21, 0)
    (out / make_images.MANIFEST).unlink()  # an interrupted run has no manifest: regenerated
    make_images.generate(out, 20, seed=0, workers=1, quiet=True)
    assert victim.exists()
