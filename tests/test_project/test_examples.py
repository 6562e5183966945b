"""The programs in examples/ run, at a tiny size, and do what they say."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


@pytest.mark.parametrize("mode", ["one-after-another", "parallel"])
def test_sweep_agents_share_one_build(tmp_path: Path, mode: str) -> None:
    pytest.importorskip("pandas")
    cache = tmp_path / "cache"
    extra = ["--parallel"] if mode == "parallel" else []
    out = run_example("sweep_agents.py", "--n", "30", "--rows", "120", "--agents", "2",
                      "--build-workers", "1", "--cache-dir", str(cache), *extra)
    lines = re.findall(r"agent (\d) \(pid (\d+)\): vectors for 120 rows \((\d+) covers\) in ([0-9.]+) s", out)
    assert sorted(k for k, *_ in lines) == ["0", "1"], out
    assert len({pid for _, pid, *_ in lines}) == 2, out  # two fresh processes
    assert "2 agents done" in out, out
    caches = tsc.list_caches(cache)
    assert len(caches) == 1, (caches, out)  # one cache: 32 x 32 float32 vectors
    covers = {int(c) for _, _, c, _ in lines}
    assert len(covers) == 1 and caches[0].entries == covers.pop(), (caches, out)
    assert caches[0].parts == 1, (caches, out)  # built once, by one agent; the other opened it


def test_dataloader_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("example_dataloader", EXAMPLES / "dataloader.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # in this process: torch is imported already
    example.main(["--n", "64", "--steps", "6", "--batch", "16", "--workers", "1",
                  "--build-workers", "1", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "64 vectors ready" in out
    losses = [float(x) for x in re.findall(r"loss +([0-9.]+)", out)]
    assert len(losses) >= 2 and all(loss == loss for loss in losses)  # no NaN
    assert re.search(r"step +6 ", out) and "final loss" in out


def test_records_example_caches_once_and_trains(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    books, cache = tmp_path / "books", tmp_path / "cache"
    args = ("--n", "120", "--steps", "40", "--batch", "16", "--workers", "1",
            "--build-workers", "1", "--cache-dir", str(cache), "--books", str(books))
    first = run_example("records.py", *args)
    assert re.search(r"^120 records ready in [0-9.]+ s \(titles of 1 to [2-8] words\)", first,
                     re.M), first
    losses = [float(x) for x in re.findall(r"loss +([0-9.]+)", first)]
    assert len(losses) >= 3 and losses[-1] < losses[0] / 2, first  # pixels and titles learnt
    second = run_example("records.py", *args)  # a later run: the same books, nothing computed
    assert "120 records ready" in second, second
    [info] = tsc.list_caches(cache)
    assert info.entries == 120 and info.parts == 1, info  # built by the first run only
    # what the cache holds is what the example's loader returns, field by field
    spec = importlib.util.spec_from_file_location("example_records", EXAMPLES / "records.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    paths = example.paths_of(books)
    store = tsc.cached(paths, loader=example.load_book, loader_id="examples.books/1",
                       fields=example.FIELDS, cache_dir=cache, workers=1, progress=False)
    assert [name for name, _ in store.spec.schema] == ["image", "title_ids", "rating"]
    for path in paths[::17]:
        want, got = example.load_book(path), store[path]
        for name in ("image", "title_ids", "rating"):
            np.testing.assert_array_equal(np.asarray(got[name]), want[name])
    assert tsc.list_caches(cache)[0].parts == 1
    store.close()
