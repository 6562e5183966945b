"""Batch transforms: per-sample randomness, seeded per step, in workers, before as_float."""

from __future__ import annotations

import doctest
import importlib
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import tensorstore_cache as tsc
import tensorstore_cache.torch as tsc_torch
from tensorstore_cache.torch import (
    ColorJitter,
    Compose,
    RandomCrop,
    RandomFlipCrop,
    RandomHorizontalFlip,
    StoreDataset,
    StoreLoader,
    StoreSampler,
    to_float32,
)

from ..conftest import doctest_setting

N, G = 40, 8


def pixels(path: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(path.encode()))
    return rng.integers(0, 256, (3, 6, 6), dtype=np.uint8)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tsc.CacheStore:
    paths = [f"covers/{i:03d}.png" for i in range(N)]
    return tsc.build_store(paths, tmp_path_factory.mktemp("aug") / "s.tsc", loader=pixels,
                           loader_id="aug/1", dtype="uint8", workers=1, progress=False, identity="none")


def batch_of_one_image(b: int = 64) -> torch.Tensor:
    """``b`` copies of one asymmetric image: every difference between samples is the transform's."""
    img = torch.arange(3 * 6 * 6, dtype=torch.uint8).reshape(3, 6, 6)
    return img.expand(b, 3, 6, 6).contiguous()


def g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_flip_is_decided_per_sample() -> None:
    x = batch_of_one_image()
    y = RandomHorizontalFlip()(x, generator=g(0))
    flipped = [bool(torch.equal(yi, x[0].flip(-1))) for yi in y]
    kept = [bool(torch.equal(yi, x[0])) for yi in y]
    assert all(f != k for f, k in zip(flipped, kept, strict=True))  # each sample one or the other
    assert 10 < sum(flipped) < 54  # both happen within one batch
    assert torch.equal(x, batch_of_one_image())  # the input is left alone
    assert torch.equal(RandomHorizontalFlip(p=0.0)(x), x)
    assert torch.equal(RandomHorizontalFlip(p=1.0)(x), x.flip(-1))


def test_crop_is_placed_per_sample() -> None:
    x = batch_of_one_image()
    pad = 2
    y = RandomCrop(pad=pad)(x, generator=g(1))
    assert y.shape == x.shape and y.dtype == torch.uint8
    padded = torch.nn.functional.pad(x[0], (pad, pad, pad, pad))
    offsets = set()
    for yi in y:
        found = [(dy, dx) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)
                 if torch.equal(yi, padded[:, dy:dy + 6, dx:dx + 6])]
        assert len(found) == 1
        offsets.add(found[0])
    assert len(offsets) > 10  # not one crop for the whole batch
    smaller = RandomCrop(4, pad=0)(x, generator=g(2))
    assert smaller.shape == (64, 3, 4, 4)
    with pytest.raises(ValueError, match="larger than the padded image"):
        RandomCrop(9, pad=1)(x)
    with pytest.raises(TypeError, match=r"\(B, C, H, W\) batch tensor"):
        RandomCrop()(x[0])


def test_flip_crop_and_jitter_vary_per_sample() -> None:
    x = batch_of_one_image()
    y = RandomFlipCrop(pad=1)(x, generator=g(3))
    padded = torch.nn.functional.pad(x[0], (1, 1, 1, 1))
    windows = [padded[:, dy:dy + 6, dx:dx + 6] for dy in range(3) for dx in range(3)]
    kinds = set()
    for yi in y:
        match = [(k, f) for k, w in enumerate(windows) for f in (False, True)
                 if torch.equal(yi, w.flip(-1) if f else w)]
        assert match, "every sample is a flipped or unflipped crop of the padded image"
        kinds.add(match[0])
    assert len(kinds) > 10
    j = ColorJitter(brightness=0.4, contrast=0.4)(x, generator=g(4))
    assert j.dtype == torch.uint8 and j.shape == x.shape
    assert len({bytes(ji.numpy()) for ji in j}) == 64  # one pair of factors per sample


def test_jitter_follows_its_formula() -> None:
    x = torch.randint(0, 256, (5, 3, 4, 4), dtype=torch.uint8, generator=g(5))
    y = ColorJitter(brightness=0.3, contrast=0.5)(x, generator=g(6))
    r = g(6)
    b = 1 - 0.3 + 0.6 * torch.rand(5, generator=r)
    c = 1 - 0.5 + 1.0 * torch.rand(5, generator=r)
    for i in range(5):
        v = (x[i].double() * float(b[i])).clamp(0, 255)
        mean = (0.299 * v[0] + 0.587 * v[1] + 0.114 * v[2]).mean()
        want = ((v - mean) * float(c[i]) + mean).clamp(0, 255).round()
        assert (y[i].double() - want).abs().max() <= 1  # float32 against float64
    floats = ColorJitter(0.3, 0.5)(to_float32(x), generator=g(6))
    assert floats.dtype == torch.float32 and float(floats.max()) <= 1.0
    assert (floats * 255 - y.float()).abs().max() <= 1


def test_other_devices_and_dtypes_draw_the_same_augmentation() -> None:
    """bfloat16 batches take the pure-torch path (as a GPU batch would): the same flips and crops."""
    x = torch.randint(0, 256, (32, 3, 6, 6), dtype=torch.uint8, generator=g(10))
    for t in (RandomFlipCrop(pad=2), RandomCrop(4, pad=1), RandomHorizontalFlip()):
        via_numpy = t(x, generator=g(11))
        via_torch = t(x.to(torch.bfloat16), generator=g(11))
        assert via_torch.dtype == torch.bfloat16 and torch.equal(via_torch.to(torch.uint8), via_numpy)
    f = to_float32(x)
    jit_numpy = ColorJitter(0.3, 0.3)(f, generator=g(12))
    jit_torch = ColorJitter(0.3, 0.3)(f.to(torch.bfloat16), generator=g(12))
    assert (jit_torch.float() - jit_numpy).abs().max() < 0.02  # bfloat16 keeps 8 bits


def test_to_float32_matches_the_numpy_conversion_bit_for_bit() -> None:
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    assert np.array_equal(to_float32(every).numpy(), tsc.to_float32(every.numpy()))
    with pytest.raises(TypeError, match="uint8 tensor"):
        to_float32(torch.zeros(2))


def test_compose_is_reproducible_with_members_that_take_no_generator() -> None:
    def noise(x: torch.Tensor) -> torch.Tensor:  # draws from torch's global RNG
        return x + torch.randint(0, 2, x.shape, dtype=x.dtype)

    t = Compose([RandomFlipCrop(pad=1), noise, ColorJitter(0.2, 0.2), to_float32])
    x = batch_of_one_image(16)
    one, two = t(x, generator=g(8)), t(x, generator=g(8))
    assert one.dtype == torch.float32 and torch.equal(one, two)
    assert not torch.equal(one, t(x, generator=g(9)))


# -- in the loader --------------------------------------------------------------------

class Recorder:
    """A batch transform (with a generator) that records the process and input it saw."""

    def __init__(self, log: str) -> None:
        self.log = log
        self.inner = RandomFlipCrop(pad=1)

    def __call__(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {x.dtype} {x.shape[0]}\n")
        return self.inner(x, generator=generator)


def flip_with_global_rng(x: torch.Tensor) -> torch.Tensor:
    """A transform without ``generator``: it draws from torch's global RNG."""
    flip = torch.rand(x.shape[0]) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


def loader_of(store: tsc.CacheStore, transform: Any, **kwargs: Any) -> StoreLoader:
    ds = StoreDataset(store, targets=np.arange(N), as_float=True)
    return ds.dataloader(sampler=StoreSampler(N, global_batch_size=G, seed=5),
                         batch_transform=transform, **kwargs)


def epochs(loader: StoreLoader, n: int) -> list[tuple[torch.Tensor, list[int]]]:
    return [(x, y.tolist()) for _ in range(n) for x, y in loader]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_augment_once_per_batch_and_exactly_as_the_main_process(
    store: tsc.CacheStore, tmp_path: Path, context: str
) -> None:
    log = tmp_path / "calls.log"
    here = epochs(loader_of(store, Recorder(str(log))), 2)
    assert [line.split()[1:] for line in log.read_text().splitlines()] == \
        [["torch.uint8", str(G)]] * (2 * N // G)  # once per batch, on the stored uint8 batch
    log.unlink()
    workers = loader_of(store, Recorder(str(log)), num_workers=2, multiprocessing_context=context,
                        persistent_workers=True, timeout=120)
    there = epochs(workers, 2)
    pids = {int(line.split()[0]) for line in log.read_text().splitlines()}
    assert len(pids) == 2 and os.getpid() not in pids
    assert len(here) == len(there) == 2 * N // G
    for (xa, ya), (xb, yb) in zip(here, there, strict=True):
        assert ya == yb and xa.dtype == torch.float32 and torch.equal(xa, xb)
    # the augmentation is live: each epoch's batches differ from the stored pixels
    stored = [torch.from_numpy(tsc.to_float32(np.stack([pixels(store.paths[i]) for i in y])))
              for _x, y in here]
    assert sum(not torch.equal(x, s) for (x, _y), s in zip(here, stored, strict=True)) > len(here) // 2


@pytest.mark.parametrize("transform", [RandomFlipCrop(pad=1), flip_with_global_rng],
                         ids=["generator", "fork_rng"])
def test_a_resumed_run_augments_the_same_way(store: tsc.CacheStore, transform: Any) -> None:
    full = epochs(loader_of(store, transform), 2)
    first = loader_of(store, transform)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    del it
    torch.manual_seed(1234)  # the caller's global RNG plays no part
    resumed = loader_of(store, transform)
    resumed.load_state_dict(state)
    rest = epochs(resumed, 2 - resumed.epoch)
    got = [(x, y.tolist()) for x, y in head] + rest
    assert len(got) == len(full)
    for (xa, ya), (xb, yb) in zip(got, full, strict=True):
        assert ya == yb and torch.equal(xa, xb)
    # another seed augments (and orders) differently
    other = StoreDataset(store, targets=np.arange(N), as_float=True).dataloader(
        sampler=StoreSampler(N, global_batch_size=G, seed=6), batch_transform=transform)
    assert any(not torch.equal(a, b) for (a, _), (b, _) in zip(epochs(other, 1), full, strict=False))


def test_fork_rng_leaves_the_callers_rng_alone(store: tsc.CacheStore) -> None:
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    for _ in loader_of(store, flip_with_global_rng):
        pass
    # the DataLoader draws one base seed per iterator from the global RNG, as any DataLoader does
    torch.manual_seed(0)
    torch.empty((), dtype=torch.int64).random_()
    after_one_iterator = torch.rand(3)
    torch.manual_seed(0)
    for _ in loader_of(store, flip_with_global_rng):
        pass
    assert torch.equal(torch.rand(3), after_one_iterator) and not torch.equal(want, after_one_iterator)


def test_targets_pass_through_and_as_float_comes_after(store: tsc.CacheStore) -> None:
    seen: list[torch.dtype] = []

    def swap_channels(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.dtype)
        return x.flip(1)

    loader = loader_of(store, swap_channels)
    x, y = next(iter(loader))
    assert seen == [torch.uint8]
    want = np.stack([pixels(store.paths[i]) for i in y.tolist()])[:, ::-1]
    np.testing.assert_array_equal(x.numpy(), tsc.to_float32(np.ascontiguousarray(want)))
    raw = StoreDataset(store).dataloader(4, batch_transform=swap_channels)
    assert next(iter(raw)).dtype == torch.uint8
    with pytest.raises(TypeError, match="as_float=True converts the uint8 batch"):
        next(iter(loader_of(store, Compose([RandomFlipCrop(pad=1), to_float32]))))
    with pytest.raises(TypeError, match="one row per item"):
        next(iter(loader_of(store, lambda x: x[:2])))
    with pytest.raises(TypeError, match="batch_transform must be callable"):
        StoreDataset(store).dataloader(4, batch_transform=3)  # type: ignore[arg-type]
    # the user's dataset is not changed by a loader's transform
    ds = StoreDataset(store)
    ds.dataloader(4, batch_transform=swap_channels)
    assert torch.equal(ds.batch([0, 1]), torch.from_numpy(store.take(np.array([0, 1]))))


@pytest.mark.parametrize("module", ["", ".dataset", ".sampler", ".loader", ".state",
                                    ".transforms", "._random"])
def test_docstring_examples_run_and_all_is_sorted(
    module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = importlib.import_module("tensorstore_cache.torch" + module)
    assert mod.__all__ == sorted(mod.__all__)
    for name in mod.__all__:
        assert hasattr(mod, name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for i, test in enumerate(doctest.DocTestFinder().find(mod, extraglobs={"torch": torch})):
        root = tmp_path / str(i)  # each docstring in its own directory, as --doctest-modules
        root.mkdir()
        test.globs.update(doctest_setting(root, monkeypatch))
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0
    assert result.attempted > 0 or module == "._random"


def test_public_names_have_docstrings_with_examples() -> None:
    for name in tsc_torch.__all__:
        obj = getattr(tsc_torch, name)
        assert obj.__doc__ and "Examples" in obj.__doc__, name
