"""With real torchvision: the write-up's transform cached as it is, the built-in loader
equal to torchvision's pipeline bit for bit, Compose loaders named by what they
compute, and a transforms.v2 transform as a seeded batch_transform.

Runs in ``.venv-torchvision`` (``make test-torchvision``, part of ``make test``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import models, transforms
from torchvision.transforms import v2

import tensorstore_cache as tsc
from tensorstore_cache.identity import explain_change
from tensorstore_cache.torch import StoreDataset

ROOT = Path(__file__).resolve().parents[3]
HANG_GUARD_S = 300


def _covers(root: Path, n: int, grey_every: int = 0) -> list[str]:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        h, w = int(rng.integers(40, 90)), int(rng.integers(30, 70))
        grey = grey_every and i % grey_every == 0
        pixels = rng.integers(0, 256, (h, w) if grey else (h, w, 3)).astype(np.uint8)
        path = root / f"{i:04d}.{'png' if i % 2 else 'jpg'}"
        Image.fromarray(pixels).save(path)
        paths.append(str(path))
    return paths


def image_vector(path: str) -> Any:
    """The write-up's transform (its Variable is a plain tensor today)."""
    img = Image.open(path)
    img = transforms.Resize((32, 32))(img)
    return torch.autograd.Variable(transforms.ToTensor()(img))


def test_the_write_ups_transform_caches_without_a_loader_id(tmp_path: Path) -> None:
    paths = _covers(tmp_path / "covers", 12)
    store = tsc.cached(paths, loader=image_vector, cache_dir=tmp_path / "cache", workers=2,
                       progress=False)
    direct = np.stack([image_vector(p).numpy() for p in paths])
    got = store.stack(paths)
    assert got.dtype == np.float32 and got.shape == (12, 3, 32, 32)
    assert got.tobytes() == direct.tobytes()  # bit for bit
    (info,) = tsc.list_caches(tmp_path / "cache")
    assert info.loader_id == tsc.loader_fingerprint(image_vector).loader_id
    assert "torchvision" in tsc.loader_fingerprint(image_vector).versions


def test_the_example_runs_twice_and_computes_once(tmp_path: Path) -> None:
    covers = tmp_path / "covers"
    _covers(covers, 20)
    outs = []
    for _ in range(2):  # two fresh processes
        proc = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "image_vector.py"), "--images", str(covers),
             "--cache-dir", str(tmp_path / "cache"), "--workers", "2"],
            capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    computed = [int(m) for m in re.findall(r"computed by this run: (\d+)", "".join(outs))]
    assert computed == [20, 0], outs
    names = re.findall(r"cache: (auto:image_vector/\w+)", "".join(outs))
    assert len(names) == 2 and names[0] == names[1], outs


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_the_built_in_loader_equals_torchvision_bit_for_bit(tmp_path: Path, mode: str) -> None:
    paths = _covers(tmp_path / "covers", 10, grey_every=1 if mode == "L" else 0)
    assert {Image.open(p).mode for p in paths} == {mode}

    def torchvision_pipeline(path: str) -> Any:
        x = transforms.ToTensor()(transforms.Resize((32, 32))(Image.open(path)))
        return (x.expand(3, 32, 32) if x.shape[0] == 1 else x).numpy()

    want = np.stack([torchvision_pipeline(p) for p in paths])
    store = tsc.cached(paths, cache_dir=tmp_path / "cache", workers=1, progress=False)
    assert store.stack(paths).tobytes() == want.tobytes()
    direct = np.stack([tsc.ImageLoader()(p) for p in paths])
    assert direct.tobytes() == want.tobytes()


COMPOSE = """
import sys
from torchvision import transforms
import tensorstore_cache as tsc

def crop_centre(img):
    return img.crop((2, 2, img.width - 2, img.height - 2))

LOADER = transforms.Compose([
    transforms.Lambda(crop_centre),
    transforms.Resize((32, 32), interpolation=transforms.InterpolationMode.BILINEAR,
                      antialias=True),
    transforms.ToTensor(),
    transforms.Normalize(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)),
])
fp = tsc.loader_fingerprint(LOADER)
print("ID", fp.loader_id, "SECONDS", fp.seconds)
"""


def _compose_id(tmp: Path, source: str, seed: str = "0") -> str:
    script = tmp / "compose.py"
    script.write_text(source)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env={**os.environ, "PYTHONHASHSEED": seed})
    assert proc.returncode == 0, proc.stderr
    found = re.findall(r"^ID (auto:Compose/\w+) ", proc.stdout, re.M)
    assert len(found) == 1, proc.stdout
    return str(found[0])


def _compose(source: str) -> Any:
    """The Compose of ``source``, built in this process (as a notebook cell would)."""
    ns: dict[str, Any] = {}
    exec(compile(source.partition("fp = ")[0], "<compose>", "exec"), ns)
    return ns["LOADER"]


def test_a_compose_keeps_its_namespace_across_processes(tmp_path: Path) -> None:
    first = _compose_id(tmp_path, COMPOSE, "1")
    assert _compose_id(tmp_path, COMPOSE, "2") == first
    moved = COMPOSE.replace("def crop_centre", "# the crop\n\n\ndef crop_centre")
    assert _compose_id(tmp_path, moved, "3") == first


@pytest.mark.parametrize(("old", "new", "why"), [
    ("Resize((32, 32)", "Resize((32, 30)", "`.size` changed (Compose -> .transforms[1] -> .size)"),
    ("antialias=True", "antialias=False", "`.antialias` changed"),
    ("InterpolationMode.BILINEAR", "InterpolationMode.BICUBIC", "`.interpolation` changed"),
    ("mean=(0.5, 0.5, 0.5)", "mean=(0.5, 0.4, 0.5)", "`.mean` changed"),
    ("img.width - 2", "img.width - 3", "`.lambd` changed (Compose -> .transforms[0] -> .lambd)"),
], ids=["resize-size", "antialias", "interpolation", "normalize-mean", "lambda-function"])
def test_a_compose_gets_a_new_namespace_when_a_transform_changes(
    tmp_path: Path, old: str, new: str, why: str
) -> None:
    assert old in COMPOSE
    loader, changed = _compose(COMPOSE), _compose(COMPOSE.replace(old, new))
    first = tsc.loader_fingerprint(loader)
    assert first.loader_id == tsc.loader_fingerprint(_compose(COMPOSE)).loader_id
    moved = tsc.loader_fingerprint(changed)
    assert first.loader_id != moved.loader_id
    assert why in explain_change(first.components, moved.components)  # the one line shown
    if old.startswith("img"):  # what repr() cannot see
        assert repr(loader.transforms[0]) == repr(changed.transforms[0]) == "Lambda()"


def test_a_compose_loader_caches_equal_to_direct_calls(tmp_path: Path) -> None:
    paths = _covers(tmp_path / "covers", 8)
    pipeline = _compose(COMPOSE)

    def load(path: str) -> Any:
        return pipeline(Image.open(path))

    store = tsc.cached(paths, loader=load, cache_dir=tmp_path / "cache", workers=1,
                       progress=False)
    want = np.stack([load(p).numpy() for p in paths])
    assert store.stack(paths).tobytes() == want.tobytes()
    (info,) = tsc.list_caches(tmp_path / "cache")
    assert info.loader_id.startswith("auto:test_a_compose_loader_caches_equal_to_direct_calls.")


def test_a_v2_transform_as_a_batch_transform_seeded_per_batch(tmp_path: Path) -> None:
    paths = _covers(tmp_path / "covers", 16)
    store = tsc.cached(paths, cache_dir=tmp_path / "cache", dtype="uint8", workers=1,
                       progress=False)
    augment = v2.Compose([v2.RandomHorizontalFlip(p=0.5), v2.RandomCrop(32, padding=4)])

    def epoch(seed: int) -> list[torch.Tensor]:
        ds = StoreDataset(store, paths, targets=np.zeros(len(paths)), as_float=True)
        return [x for x, _ in ds.dataloader(4, batch_transform=augment, seed=seed)]

    first, again, other = epoch(0), epoch(0), epoch(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    raw = torch.from_numpy(store.stack(paths)).float() / 255
    assert any(not torch.equal(b, raw[4 * i: 4 * i + 4]) for i, b in enumerate(first))
    # one set of parameters per batch: a whole batch is flipped, or none of it
    flip = v2.RandomHorizontalFlip(p=0.5)
    seen = set()
    for seed in range(6):
        ds = StoreDataset(store, paths, targets=np.zeros(len(paths)), as_float=True)
        for i, (x, _) in enumerate(ds.dataloader(4, batch_transform=flip, seed=seed)):
            batch = raw[4 * i: 4 * i + 4]
            flipped = [torch.equal(x[j], batch[j].flip(-1)) for j in range(4)]
            kept = [torch.equal(x[j], batch[j]) for j in range(4)]
            assert all(flipped) or all(kept)
            seen.add(all(flipped))
    assert seen == {True, False}


def test_the_fingerprint_benchmark_writes_stamped_figures(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.fingerprint", "--calls", "2", "--results",
         str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "fingerprint.json").read_text())
    assert set(report["cases"]) == {"image_vector", "compose4", "labels_100k", "resnet18"}
    assert report["cases"]["image_vector"]["loader_id"].startswith("auto:image_vector/")
    state = models.resnet18(weights=None).state_dict()  # every weight's and buffer's bytes
    assert report["cases"]["resnet18"]["array_bytes"] == sum(
        t.numel() * t.element_size() for t in state.values())
    assert all(r["n"] == 2 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
               for r in report["cases"].values())
    assert report["stamp"]["command"] == (  # the results' place named portably
        "python -m benchmarks.fingerprint --calls 2 --results <results>")
    assert "| `compose4` |" in (tmp_path / "fingerprint.md").read_text()
