"""StoreSampler: its own permutation, rank slices of global batches, the tail, plain DataLoaders."""

from __future__ import annotations

import itertools
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import tensorstore_cache as tsc  # noqa: E402
from tensorstore_cache.torch import StoreDataset, StoreSampler  # noqa: E402
from tensorstore_cache.torch._random import mix, permutation, splitmix64  # noqa: E402

MASK = (1 << 64) - 1


def reference_splitmix64(z: int) -> int:
    """splitmix64's finaliser, written from the published algorithm (Steele, Lea, Flood 2014)."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 % (1 << 64)
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB % (1 << 64)
    return z ^ (z >> 31)


def reference_permutation(n: int, key: int) -> list[int]:
    """Stable argsort of the top bits of the splitmix64 stream from ``key``, in plain Python."""
    bits = max(1, (n - 1).bit_length())
    values = [reference_splitmix64((key + (i + 1) * 0x9E3779B97F4A7C15) % (1 << 64)) >> bits
              for i in range(n)]
    return sorted(range(n), key=lambda i: values[i])  # Python's sort is stable


def test_splitmix64_matches_the_published_algorithm() -> None:
    # the first outputs of the splitmix64 generator seeded with 0 (as in Vigna's C code)
    state, outputs = 0, []
    for _ in range(3):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        outputs.append(splitmix64(state))
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    for z in (0, 1, 2**63, MASK, 12345678901234567):
        assert splitmix64(z) == reference_splitmix64(z)
    assert mix(1, 2) != mix(2, 1) and mix(0, 0) != mix(0, 1)


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 4097])
def test_permutation_equals_a_plain_python_stable_argsort(n: int) -> None:
    for key in (0, 1, mix(5, 3)):
        assert permutation(n, key).tolist() == reference_permutation(n, key)


def test_order_is_the_same_in_a_fresh_process() -> None:
    code = ("from tensorstore_cache.torch import StoreSampler; import hashlib; "
            "s = StoreSampler(181777, global_batch_size=256, seed=42); "
            "print(hashlib.sha256(s.permutation(7).tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import hashlib

    here = StoreSampler(181777, global_batch_size=256, seed=42).permutation(7)
    assert out.stdout.strip() == hashlib.sha256(here.tobytes()).hexdigest()


def test_epochs_and_seeds_shuffle_differently() -> None:
    s = StoreSampler(1000, global_batch_size=10, seed=0)
    p0, p1 = s.permutation(0).copy(), s.permutation(1).copy()
    assert sorted(p0.tolist()) == list(range(1000)) and sorted(p1.tolist()) == list(range(1000))
    assert not np.array_equal(p0, p1)
    assert not np.array_equal(p0, StoreSampler(1000, global_batch_size=10, seed=1).permutation(0))
    assert np.array_equal(p0, s.permutation(0))
    unshuffled = StoreSampler(10, global_batch_size=5, shuffle=False)
    assert unshuffled.permutation(3).tolist() == list(range(10))


@pytest.mark.parametrize("drop_last", [True, False])
def test_global_batches_are_the_same_for_every_world_size_dividing_g(drop_last: bool) -> None:
    n, g = 203, 12
    one = StoreSampler(n, global_batch_size=g, seed=3, drop_last=drop_last, rank=0, world_size=1)
    steps = n // g if drop_last else n // g + 1
    assert len(one) == one.steps_per_epoch == steps
    for epoch in (0, 1):
        want = [b for b in one.batches(epoch)]
        assert len(want) == steps
        for w in (2, 3, 4, 6, 12):
            ranks = [StoreSampler(n, global_batch_size=g, seed=3, drop_last=drop_last, rank=r,
                                  world_size=w) for r in range(w)]
            per_rank = [list(s.batches(epoch)) for s in ranks]
            assert {len(b) for b in per_rank} == {steps}  # every rank the same number of batches
            for step in range(steps):
                slices = [per_rank[r][step] for r in range(w)]
                joined = [i for sl in slices for i in sl]
                if step < n // g:
                    assert joined == list(want[step]), (w, step)
                    assert {len(sl) for sl in slices} == {g // w}
                assert joined == ranks[0].global_batch(epoch, step).tolist()
                assert len(set(joined)) == len(joined)  # the ranks' rows are disjoint
                assert {b.step for b in slices} == {step} and {b.epoch for b in slices} == {epoch}
            seen = [i for b in per_rank for batch in b for i in batch]
            if drop_last:
                assert len(seen) == len(set(seen)) == steps * g


def test_the_tail_is_split_evenly_and_a_short_tail_wraps_to_the_first_rows() -> None:
    # n = 2 * 8 + 6: a tail of 6 over 4 ranks -> slices of 2, 2, 1, 1
    n, g = 22, 8
    ranks = [StoreSampler(n, global_batch_size=g, seed=1, drop_last=False, rank=r, world_size=4)
             for r in range(4)]
    perm = ranks[0].permutation(0)
    tails = [list(s.batches(0))[-1] for s in ranks]
    assert [len(t) for t in tails] == [2, 2, 1, 1]
    assert [i for t in tails for i in t] == perm[16:].tolist()  # contiguous, in order
    # n = 2 * 8 + 3: a tail of 3 over 4 ranks is padded with the epoch's first row
    n = 19
    ranks = [StoreSampler(n, global_batch_size=g, seed=1, drop_last=False, rank=r, world_size=4)
             for r in range(4)]
    perm = ranks[0].permutation(0)
    tails = [list(s.batches(0))[-1] for s in ranks]
    assert [len(t) for t in tails] == [1, 1, 1, 1]
    assert [i for t in tails for i in t] == [*perm[16:].tolist(), int(perm[0])]
    # fewer items than ranks: the padding wraps around the epoch's rows again
    ranks = [StoreSampler(2, global_batch_size=8, seed=1, drop_last=False, rank=r, world_size=8)
             for r in range(8)]
    perm = ranks[0].permutation(0).tolist()
    assert [list(s) for s in ranks] == [[[perm[i % 2]]] for i in range(8)]


def test_bad_world_sizes_name_the_ones_that_work() -> None:
    with pytest.raises(ValueError, match=r"world sizes that work with global_batch_size=12: "
                                         r"1, 2, 3, 4, 6, 12"):
        StoreSampler(100, global_batch_size=12, rank=0, world_size=5)
    with pytest.raises(ValueError, match="rank=4 is out of range for world_size=4"):
        StoreSampler(100, global_batch_size=12, rank=4, world_size=4)
    with pytest.raises(ValueError, match="drop_last=False or a global_batch_size of at most 10"):
        StoreSampler(10, global_batch_size=12)
    with pytest.raises(ValueError, match=r"n must be >= 0"):
        StoreSampler(-1, global_batch_size=1)
    empty = StoreSampler(0, global_batch_size=4)
    assert len(empty) == 0 and list(empty) == [] and empty.permutation(0).tolist() == []
    with pytest.raises(ValueError, match="seed must be in"):
        StoreSampler(10, global_batch_size=1, seed=-1)
    with pytest.raises(TypeError, match="global_batch_size must be an integer"):
        StoreSampler(10, global_batch_size=2.0)  # type: ignore[arg-type]


def test_rank_and_world_size_come_from_torch_distributed(tmp_path: Path) -> None:
    """Two real processes in a gloo group: each sampler finds its rank without being told."""
    code = f'''
import sys, torch.distributed as dist
from tensorstore_cache.torch import StoreSampler
rank = int(sys.argv[1])
before = StoreSampler(40, global_batch_size=4, seed=2)
dist.init_process_group("gloo", init_method="file://{tmp_path / 'rendezvous'}", rank=rank,
                        world_size=2)
s = StoreSampler(40, global_batch_size=4, seed=2)
print(before.rank, before.world_size, s.rank, s.world_size, *[i for b in s for i in b])
dist.barrier()
dist.destroy_process_group()
'''
    # The barrier keeps each rank's sockets open until the other has finished connecting: gloo's
    # connectFullMesh can return in rank 0 before rank 1's side of the pair is complete, and a
    # rank 0 that exits then fails rank 1 with "Connection closed by peer".
    env = {**__import__("os").environ, "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    fields = [list(map(int, out.split())) for out, _err in outs]
    assert [f[:4] for f in fields] == [[0, 1, 0, 2], [0, 1, 1, 2]]
    ref = StoreSampler(40, global_batch_size=4, seed=2, rank=0, world_size=1)
    for step in range(10):
        assert fields[0][4 + 2 * step: 6 + 2 * step] + fields[1][4 + 2 * step: 6 + 2 * step] \
            == ref.global_batch(0, step).tolist()


def pixels(path: str) -> np.ndarray:
    return np.full((2,), zlib.crc32(path.encode()) % 251, dtype=np.uint8)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_plain_dataloader_takes_it_as_batch_sampler(tmp_path: Path, context: str) -> None:
    paths = [f"p/{i}" for i in range(30)]
    store = tsc.build_store(paths, tmp_path / "s.tsc", loader=pixels, loader_id="px/1",
                            dtype="uint8", workers=1, progress=False, identity="none")
    ds = StoreDataset(store, targets=np.arange(30))
    sampler = StoreSampler(30, global_batch_size=8, seed=5, drop_last=False, rank=1, world_size=2)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, multiprocessing_context=context,
                        persistent_workers=True, timeout=120)
    first = [y.tolist() for _x, y in loader]
    assert first == [list(b) for b in sampler.batches(0)]
    assert [len(b) for b in first] == [4, 4, 4, 3]  # the tail of 6 -> 3 per rank
    assert sampler.epoch == 1  # a full pass advanced the epoch: a new order
    second = [y.tolist() for _x, y in loader]
    assert second == [list(b) for b in sampler.batches(1)] and second != first
    sampler.set_epoch(0)
    assert [y.tolist() for _x, y in loader] == first
    for (x, y) in itertools.islice(loader, 1):
        np.testing.assert_array_equal(x.numpy(), np.stack([pixels(paths[i]) for i in y.tolist()]))
