"""StoreLoader's state: the resume bugs of other loaders, each tried for real.

Two resumes within one epoch; a resume exactly at an epoch boundary; a save
right after a resume; ``num_workers`` 0 <-> 2 (fork and spawn workers)
between save and resume; prefetched batches not counted; an early ``break``
then iterating again; exhausting an iterator advances the epoch once; a
changed store refused (or the epoch restarted); a state loaded while an
iterator runs refused; world sizes changed at the same global batch.
"""

from __future__ import annotations

import itertools
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tensorstore_cache as tsc  # noqa: E402
from tensorstore_cache.torch import StoreDataset, StoreLoader, StoreSampler  # noqa: E402

N, G = 50, 4
STEPS = N // G  # 12 with drop_last=True


def pixels(path: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(path.encode()))
    return rng.integers(0, 256, (3, 4, 4), dtype=np.uint8)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tsc.CacheStore:
    paths = [f"covers/{i:03d}.png" for i in range(N)]
    return tsc.build_store(paths, tmp_path_factory.mktemp("resume") / "s.tsc", loader=pixels,
                           loader_id="resume/1", dtype="uint8", workers=1, progress=False, identity="none")


def dataset(store: tsc.CacheStore) -> StoreDataset:
    """Items are the store's rows; the targets are the item ids, so batches name their rows."""
    return StoreDataset(store, targets=np.arange(len(store)))


def loader_of(store: tsc.CacheStore, *, seed: int = 7, world: tuple[int, int] = (0, 1),
              drop_last: bool = True, **kwargs: Any) -> StoreLoader:
    ds = dataset(store)
    sampler = StoreSampler(len(ds), global_batch_size=G, seed=seed, drop_last=drop_last,
                           rank=world[0], world_size=world[1])
    return ds.dataloader(sampler=sampler, **kwargs)


def ids(batch: Any) -> list[int]:
    _x, y = batch
    return [int(i) for i in y]


def reference(store: tsc.CacheStore, epochs: int, seed: int = 7) -> list[tuple[int, list[int]]]:
    """(epoch, item ids) of every batch of an uninterrupted run."""
    loader = loader_of(store, seed=seed)
    out = []
    for epoch in range(epochs):
        assert loader.epoch == epoch
        out += [(epoch, ids(b)) for b in loader]
    return out


def through_json(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    return out


def run(loader: StoreLoader, epochs: int, stop_after: int | None = None
        ) -> tuple[list[tuple[int, list[int]]], dict[str, Any] | None]:
    """Train like a script: ``for epoch in range(loader.epoch, epochs)``; save after ``stop_after`` batches."""
    seen: list[tuple[int, list[int]]] = []
    for epoch in range(loader.epoch, epochs):
        for batch in loader:
            seen.append((epoch, ids(batch)))
            if stop_after is not None and len(seen) == stop_after:
                return seen, through_json(loader.state_dict())
    return seen, None


def test_an_uninterrupted_run_reads_every_row_once_per_epoch(store: tsc.CacheStore) -> None:
    ref = reference(store, 3)
    assert len(ref) == 3 * STEPS
    for epoch in range(3):
        rows = [i for e, b in ref if e == epoch for i in b]
        assert len(rows) == len(set(rows)) == STEPS * G
    assert [b for e, b in ref if e == 0] != [b for e, b in ref if e == 1]


def test_two_resumes_within_one_epoch(store: tsc.CacheStore) -> None:
    ref = reference(store, 2)
    a, state = run(loader_of(store), 2, stop_after=3)
    assert state is not None and (state["epoch"], state["consumed"]) == (0, 3)
    second = loader_of(store)
    second.load_state_dict(state)
    b, state = run(second, 2, stop_after=4)
    assert state is not None and (state["epoch"], state["consumed"]) == (0, 7)
    third = loader_of(store)
    third.load_state_dict(state)
    c, state = run(third, 2)
    assert state is None and third.epoch == 2
    assert a + b + c == ref


def test_resume_exactly_at_an_epoch_boundary(store: tsc.CacheStore) -> None:
    ref = reference(store, 3)
    a, state = run(loader_of(store), 3, stop_after=STEPS)  # saved right after the last batch
    assert state is not None and (state["epoch"], state["consumed"]) == (1, 0)
    resumed = loader_of(store)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    b, _ = run(resumed, 3)
    assert a + b == ref  # no epoch skipped, none repeated
    # a state that counts every step of its epoch loads as the next epoch's start
    other = loader_of(store)
    other.load_state_dict({**state, "epoch": 0, "consumed": STEPS})
    assert (other.epoch, other.state_dict()["consumed"]) == (1, 0)
    assert run(other, 3)[0] == b
    with pytest.raises(ValueError, match="consumed=13 is more than the 12 steps"):
        loader_of(store).load_state_dict({**state, "consumed": STEPS + 1})


def test_a_save_right_after_a_resume_is_the_loaded_state(store: tsc.CacheStore) -> None:
    ref = reference(store, 2)
    a, state = run(loader_of(store), 2, stop_after=5)
    assert state is not None
    resumed = loader_of(store)
    resumed.load_state_dict(state)
    again = through_json(resumed.state_dict())
    assert again == state
    it = iter(resumed)
    assert resumed.state_dict() == state  # making the iterator consumes nothing
    first = ids(next(it))
    assert through_json(resumed.state_dict())["consumed"] == 6
    del it
    twice = loader_of(store)
    twice.load_state_dict(again)
    b, _ = run(twice, 2)
    assert b[0] == (0, first)
    assert a + b == ref


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_num_workers_changes_between_save_and_resume(store: tsc.CacheStore, context: str) -> None:
    ref = reference(store, 2)
    a, state = run(loader_of(store), 2, stop_after=5)  # num_workers=0
    assert state is not None
    with_workers = loader_of(store, num_workers=2, multiprocessing_context=context,
                             persistent_workers=True, prefetch_factor=4, timeout=120)
    with_workers.load_state_dict(state)
    b, state = run(with_workers, 2, stop_after=2 * STEPS - 5 - 3)  # 3 batches before the end
    assert state is not None and (state["epoch"], state["consumed"]) == (1, STEPS - 3)
    # the workers had prefetched the epoch's last batches: they are not counted
    last = loader_of(store)  # num_workers=0 again
    last.load_state_dict(state)
    c, _ = run(last, 2)
    assert len(c) == 3
    assert a + b + c == ref


def test_early_break_then_iterating_again_continues_the_epoch(store: tsc.CacheStore) -> None:
    ref = [b for _e, b in reference(store, 2)]
    fork: dict[str, Any] = {"num_workers": 2, "multiprocessing_context": "fork", "timeout": 120}
    options: list[dict[str, Any]] = [{}, fork, {**fork, "persistent_workers": True}]
    for kwargs in options:
        loader = loader_of(store, **kwargs)
        seen = [ids(b) for b in itertools.islice(loader, 3)]  # break after 3
        assert (loader.epoch, loader.state_dict()["consumed"]) == (0, 3)
        for batch in loader:  # goes on with the 4th
            seen.append(ids(batch))
            if len(seen) == 5:
                break
        seen += [ids(b) for b in loader]  # the rest of epoch 0: the iterator ends there
        assert loader.epoch == 1, kwargs  # exhausting advanced the epoch, once
        assert seen == ref[:STEPS], kwargs
        seen += [ids(b) for b in loader]
        assert loader.epoch == 2 and seen == ref, kwargs


def test_the_epoch_advances_once_when_the_last_batch_is_handed_over(store: tsc.CacheStore) -> None:
    loader = loader_of(store)
    it = iter(loader)
    for _ in range(STEPS - 1):
        next(it)
    assert loader.epoch == 0
    next(it)  # the last batch of epoch 0
    assert (loader.epoch, loader.state_dict()["consumed"]) == (1, 0)
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert loader.epoch == 1
    assert len(list(loader)) == len(loader) == STEPS and loader.epoch == 2


def test_set_epoch_on_the_sampler_at_an_epoch_start_is_followed(store: tsc.CacheStore) -> None:
    """The DistributedSampler habit: ``sampler.set_epoch(epoch)`` before each epoch."""
    ref = reference(store, 3)
    loader = loader_of(store)
    seen = []
    for epoch in (0, 2):  # epoch 1 skipped on purpose
        loader.sampler.set_epoch(epoch)
        seen += [(epoch, ids(b)) for b in loader]
    assert seen == [r for r in ref if r[0] != 1]
    assert loader.epoch == 3
    it = iter(loader)
    assert len(it) == STEPS
    next(it)
    del it
    loader.sampler.set_epoch(0)
    with pytest.raises(RuntimeError, match="set_epoch"):
        iter(loader)
    resumed = loader_of(store)
    resumed.load_state_dict(loader.state_dict())
    assert len(iter(resumed)) == STEPS - 1 and len(resumed) == STEPS


def test_load_state_dict_while_an_iterator_runs_is_refused(store: tsc.CacheStore) -> None:
    _, state = run(loader_of(store), 1, stop_after=2)
    assert state is not None
    loader = loader_of(store)
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="before iterating"):
        loader.load_state_dict(state)
    assert loader.state_dict()["consumed"] == 1  # unchanged
    del it  # an iterator given up on no longer counts
    loader.load_state_dict(state)
    assert loader.state_dict()["consumed"] == 2
    # an iterator made before the load is replaced by the next one, never silently restarted
    it = iter(loader)
    newer = iter(loader)
    with pytest.raises(RuntimeError, match="replaced by a newer iter"):
        next(it)
    assert ids(next(newer)) == reference(store, 1)[2][1]
    for _ in newer:
        pass
    loader.load_state_dict(state)  # an exhausted iterator does not stand in the way


def test_a_changed_store_is_refused_or_restarts_the_epoch(store: tsc.CacheStore, tmp_path: Path) -> None:
    _, state = run(loader_of(store), 2, stop_after=STEPS + 5)
    assert state is not None and (state["epoch"], state["consumed"]) == (1, 5)
    # one more key: another length
    paths = [*store.paths, "covers/new.png"]
    bigger = tsc.build_store(paths, tmp_path / "bigger.tsc", loader=pixels, loader_id="resume/1",
                             dtype="uint8", workers=1, progress=False, identity="none")
    with pytest.raises(ValueError, match="number of items changed from 50 to 51") as info:
        loader_of(bigger).load_state_dict(state)
    assert "on_change='restart_epoch'" in str(info.value)
    restarted = loader_of(bigger)
    restarted.load_state_dict(state, on_change="restart_epoch")
    assert (restarted.epoch, restarted.state_dict()["consumed"]) == (1, 0)
    # the same number of keys, one renamed
    renamed = tsc.build_store([*store.paths[:-1], "covers/other.png"], tmp_path / "renamed.tsc",
                              loader=pixels, loader_id="resume/1", dtype="uint8", workers=1,
                              progress=False, identity="none")
    with pytest.raises(ValueError, match="the keys or their order changed"):
        loader_of(renamed).load_state_dict(state)
    # the same keys in another order (a dataset over a reversed path list)
    reordered = StoreDataset(store, store.paths[::-1], targets=np.arange(N))
    sampler = StoreSampler(N, global_batch_size=G, seed=7)
    with pytest.raises(ValueError, match="the keys or their order changed"):
        reordered.dataloader(sampler=sampler).load_state_dict(state)
    # the same keys stored again (a rebuilt store) resume
    rebuilt = tsc.build_store(store.paths, tmp_path / "rebuilt.tsc", loader=pixels,
                              loader_id="resume/1", dtype="uint8", workers=1, progress=False, identity="none")
    loader = loader_of(rebuilt)
    loader.load_state_dict(state)
    assert loader.state_dict() == state
    with pytest.raises(ValueError, match="on_change must be"):
        loader.load_state_dict(state, on_change="ignore")  # type: ignore[arg-type]


def test_states_from_other_settings_are_refused_and_the_seed_travels(store: tsc.CacheStore) -> None:
    _, state = run(loader_of(store, seed=3), 2, stop_after=4)
    assert state is not None
    assert set(state) == {"version", "seed", "epoch", "consumed", "n", "global_batch", "digest",
                          "shuffle", "drop_last"}
    ds = dataset(store)
    with pytest.raises(ValueError, match="global_batch_size=4, this loader's sampler has 5"):
        ds.dataloader(sampler=StoreSampler(N, global_batch_size=5)).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with shuffle=True"):
        ds.dataloader(sampler=StoreSampler(N, global_batch_size=G, shuffle=False)).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with drop_last=True"):
        ds.dataloader(sampler=StoreSampler(N, global_batch_size=G, drop_last=False)).load_state_dict(state)
    with pytest.raises(ValueError, match="missing digest"):
        loader_of(store).load_state_dict({k: v for k, v in state.items() if k != "digest"})
    with pytest.raises(ValueError, match="version 2 is not supported"):
        loader_of(store).load_state_dict({**state, "version": 2})
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        loader_of(store).load_state_dict({**state, "epoch": -1})
    with pytest.raises(TypeError, match="expects the dict"):
        loader_of(store).load_state_dict([1, 2])  # type: ignore[arg-type]
    # a sampler made with another seed continues the saved order: the state's seed wins
    loader = loader_of(store, seed=0)
    loader.load_state_dict(state)
    assert loader.sampler.seed == 3
    assert run(loader, 2)[0] == reference(store, 2, seed=3)[4:]


def test_world_size_changes_at_the_same_global_batch(store: tsc.CacheStore) -> None:
    """Saved by 2 ranks, resumed by 1 and by 4 (in one process, ranks given explicitly)."""
    g = 8
    def make(rank: int, world: int) -> StoreLoader:
        return dataset(store).dataloader(sampler=StoreSampler(N, global_batch_size=g, seed=1,
                                                              rank=rank, world_size=world))

    full = [ids(b) for b in make(0, 1)]
    two = [make(r, 2) for r in range(2)]
    its = [iter(lo) for lo in two]
    got = [ids(next(its[0])) + ids(next(its[1])) for _ in range(2)]
    states = [lo.state_dict() for lo in two]
    assert states[0] == states[1]  # the same state on every rank
    del its
    for world in (1, 4):
        ranks = [make(r, world) for r in range(world)]
        for lo in ranks:
            lo.load_state_dict(states[0])
        rest = [[i for b in batches for i in ids(b)] for batches in zip(*ranks, strict=True)]
        assert got + rest == full, world


def test_dataloader_arguments(store: tsc.CacheStore) -> None:
    ds = dataset(store)
    sampler = StoreSampler(N, global_batch_size=G)
    for bad in ({"batch_size": 4}, {"shuffle": True}, {"drop_last": False}, {"seed": 1},
                {"generator": torch.Generator()}):
        with pytest.raises(TypeError, match=f"takes {next(iter(bad))} from the sampler"):
            ds.dataloader(sampler=sampler, **bad)
    with pytest.raises(TypeError, match="needs batch_size"):
        ds.dataloader()
    with pytest.raises(TypeError, match="sampler= takes a StoreSampler"):
        ds.dataloader(sampler=torch.utils.data.SequentialSampler(ds))
    with pytest.raises(ValueError, match="over 49 items, this dataset has 50"):
        ds.dataloader(sampler=StoreSampler(N - 1, global_batch_size=G))
    with pytest.raises(TypeError, match="in_order=False"):
        ds.dataloader(sampler=sampler, in_order=False)
    with pytest.raises(TypeError, match="seed= or generator="):
        ds.dataloader(4, seed=1, generator=torch.Generator())


def test_a_loader_without_sampler_resumes_too(store: tsc.CacheStore) -> None:
    ds = dataset(store)
    assert list(StoreDataset(store, []).dataloader(16)) == []  # an empty dataset: no batch
    plain = ds.dataloader(16)
    assert [len(y) for _x, y in plain] == [16, 16, 16, 2]
    shuffled = ds.dataloader(16, shuffle=True, seed=4)
    first = [ids(b) for b in shuffled]
    assert sorted(i for b in first for i in b) == list(range(N)) and shuffled.epoch == 1
    again = ds.dataloader(16, shuffle=True, seed=4)
    it = iter(again)
    next(it)
    state = again.state_dict()
    del it
    resumed = ds.dataloader(16, shuffle=True, seed=4)
    resumed.load_state_dict(state)
    assert [ids(b) for b in resumed] == first[1:]
    # a torch generator draws the seed: the same generator state, the same order
    orders = [[ids(b) for b in ds.dataloader(16, shuffle=True, generator=torch.Generator().manual_seed(9))]
              for _ in range(2)]
    assert orders[0] == orders[1] != first
