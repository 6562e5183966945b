"""A real DDP job: ``torchrun`` with the gloo backend on CPU, killed and resumed elsewhere.

A job of 2 processes trains for 1.5 epochs, checkpoints (model, optimiser,
``loader.state_dict()``), trains on and is killed; 1 process resumes from
that checkpoint, checkpoints at 2.25 epochs and is killed too; 4 processes
resume from there and finish the 3 epochs (the global batch stays 8). The
global batches the interrupted job trained on, step by step, are exactly
those of an uninterrupted run of the same training (in this process: one
process sees each global batch whole), and so are its final weights; within
each step the ranks' rows are disjoint, and no row repeats within an epoch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tensorstore_cache as tsc  # noqa: E402

from ..support._clients import REPO, environment  # noqa: E402

SCRIPT = REPO / "tests" / "support" / "_ddp_train.py"
N, G, EPOCHS = 100, 8, 3
SEED, LR = 11, 0.05  # the script's defaults
STEPS = N // G  # drop_last=True: 12 steps an epoch
TIMEOUT_S = 180  # a guard against hangs, not a timing assertion


def pixels(path: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(path.encode()))
    return rng.integers(0, 256, (3, 4, 4), dtype=np.uint8)


def torchrun(nproc: int, *args: str) -> subprocess.Popen[str]:
    """torchrun on one node; its rendezvous store binds a free port itself (``--standalone``).

    A port picked here, closed and then bound by torchrun could be taken in between, e.g. by the
    gloo sockets of a test running beside this one in another xdist worker.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--standalone", str(SCRIPT), *args]
    env = environment(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen[str]) -> None:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        kill(proc)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err}"


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL torchrun and its ranks (one process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def kill_after_step(proc: subprocess.Popen[str], log: Path, step: int) -> None:
    """Wait until rank 0 logged global step ``step`` (trained past its checkpoint), then kill."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"the job ended before it was killed ({proc.returncode})\n{out}\n{err}")
            if log.exists() and any(json.loads(line)["step"] == step
                                    for line in log.read_text().splitlines() if line.endswith("}")):
                return
            time.sleep(0.05)
        raise AssertionError(f"no step {step} in {log} after {TIMEOUT_S} s")
    finally:
        kill(proc)


def global_batches(logs: Path, run: str, world: int, steps: range) -> dict[int, list[list[int]]]:
    """Global step -> each rank's rows, from the runs' logs (complete lines only)."""
    by_step: dict[int, dict[int, list[int]]] = defaultdict(dict)
    epochs: dict[int, int] = {}
    for rank in range(world):
        for line in (logs / f"{run}-rank{rank}.jsonl").read_text().splitlines():
            if not line.endswith("}"):
                continue  # the line being written when the job was killed
            entry = json.loads(line)
            if entry["step"] in steps:
                assert rank not in by_step[entry["step"]], (run, rank, entry)
                by_step[entry["step"]][rank] = entry["rows"]
                assert epochs.setdefault(entry["step"], entry["epoch"]) == entry["epoch"]
    out = {}
    for step in steps:
        assert sorted(by_step[step]) == list(range(world)), (run, step, by_step[step])
        assert epochs[step] == step // STEPS, (run, step, epochs[step])
        out[step] = [by_step[step][r] for r in range(world)]
    return out


def test_ddp_job_killed_and_resumed_on_other_world_sizes(tmp_path: Path) -> None:
    paths = [f"covers/{i:03d}.png" for i in range(N)]
    store = tsc.build_store(paths, tmp_path / "s.tsc", loader=pixels, loader_id="ddp/1",
                            dtype="uint8", workers=1, progress=False, identity="none")
    logs = tmp_path / "logs"
    logs.mkdir()
    common = ["--store", store.location, "--journal", str(logs), "--global-batch", str(G),
              "--epochs", str(EPOCHS)]
    a, b = str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")
    first_stop, second_stop = STEPS * 3 // 2, STEPS * 9 // 4  # 1.5 and 2.25 epochs

    # 2 processes, checkpoint at 1.5 epochs, killed while training on
    job = torchrun(2, *common, "--name", "w2", "--save", a, "--save-at", str(first_stop))
    kill_after_step(job, logs / "w2-rank0.jsonl", first_stop)
    # 1 process (2 DataLoader workers) resumes, checkpoints at 2.25 epochs, is killed
    job = torchrun(1, *common, "--name", "w1", "--resume", a, "--save", b,
                   "--save-at", str(second_stop), "--workers", "2")
    kill_after_step(job, logs / "w1-rank0.jsonl", second_stop)
    # 4 processes resume and finish
    finish(torchrun(4, *common, "--name", "w4", "--resume", b))

    total = STEPS * EPOCHS
    want, weights = uninterrupted(store)
    got = {**global_batches(logs, "w2", 2, range(first_stop)),
           **global_batches(logs, "w1", 1, range(first_stop, second_stop)),
           **global_batches(logs, "w4", 4, range(second_stop, total))}
    flat = {s: [r for rows in ranks for r in rows] for s, ranks in got.items()}
    assert [flat[s] for s in range(total)] == want
    for step, ranks in got.items():
        assert all(len(rows) == G // len(ranks) for rows in ranks), (step, ranks)
        assert len(set(flat[step])) == G, (step, ranks)  # the ranks' rows are disjoint
    for epoch in range(EPOCHS):
        seen = [r for s in range(epoch * STEPS, (epoch + 1) * STEPS) for r in flat[s]]
        assert len(seen) == len(set(seen)) == STEPS * G  # no row twice in an epoch
    assert [flat[s] for s in range(STEPS)] != [flat[s] for s in range(STEPS, 2 * STEPS)]
    # the same training, step for step: the final weights agree (up to reduction order)
    final = torch.load(logs / "w4-final.pt", weights_only=True)
    for name, value in weights.items():
        torch.testing.assert_close(final[name], value, rtol=1e-4, atol=1e-5)


def uninterrupted(store: tsc.CacheStore) -> tuple[list[list[int]], dict[str, Any]]:
    """The same training in this process, never interrupted: its global batches and final weights.

    One process sees whole global batches; DDP averages the ranks' gradients of the
    mean loss over their slices, which is the gradient of the mean over the global batch.
    """
    from tensorstore_cache.torch import StoreDataset, StoreSampler

    ds = StoreDataset(store, targets=np.arange(N), as_float=True)
    loader = ds.dataloader(sampler=StoreSampler(N, global_batch_size=G, seed=SEED))
    torch.manual_seed(0)
    model = torch.nn.Linear(int(np.prod(ds[0][0].shape)), 1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batches = []
    for _epoch in range(loader.epoch, EPOCHS):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.flatten(1)),
                                                y.to(torch.float32).unsqueeze(1) / N)
            opt.zero_grad()
            loss.backward()
            opt.step()
            batches.append(y.tolist())
    return batches, model.state_dict()
