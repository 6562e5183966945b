"""A tiny DDP training script, run by ``torchrun`` in the tests (gloo backend, CPU).

Each rank reads a store through ``ds.dataloader(sampler=StoreSampler(...))``
(rank and world size from ``torch.distributed``), trains a linear model
wrapped in ``DistributedDataParallel`` and appends one JSON line per step to
``<log>/<run>-rank<r>.jsonl``: the epoch, the global step and the item ids of
its batch (the targets are the item ids). With ``--save-at K`` rank 0 writes
a checkpoint (model, optimiser, ``loader.state_dict()``) after global step
``K`` and every rank goes on training, slowly, until the test kills the job.
``--resume`` starts from that checkpoint. At the end rank 0 writes the final
weights next to the log, and every rank closes the process group for good
(its gloo threads joined) before the interpreter exits.

Run: ``torchrun --nproc_per_node=2 tests/support/_ddp_train.py --store S --journal DIR --name NAME
[--save CKPT --save-at K] [--resume CKPT]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import weakref
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

# Imported before the process group exists, on purpose. torch.distributed.nn's collectives take
# ``group=group.WORLD`` as a default argument, evaluated when the module is first imported:
# imported later (constructing DistributedDataParallel imports it), ten of them would hold the
# default group for the rest of the process, destroy_process_group() could not release it, and
# gloo's threads would be torn down only during the interpreter's finalisation, while the other
# ranks exit and close their connections, instead of inside destroy_process_group().
import torch.distributed.nn
from torch.nn.parallel import DistributedDataParallel

import tensorstore_cache as tsc
from tensorstore_cache.torch import StoreDataset, StoreSampler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--journal", required=True, help="directory of the step logs")
    ap.add_argument("--name", required=True, help="name of this run in the logs")
    ap.add_argument("--save", help="checkpoint to write after global step --save-at")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--save-at", type=int, default=-1, help="global step after which to save")
    ap.add_argument("--resume", help="checkpoint to start from")
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    train(args)
    # The model, its optimiser and the loader are gone with train()'s frame: nothing else holds
    # the group. Every rank is done with it (the barrier) before any closes its connections.
    dist.barrier()
    group = weakref.ref(dist.group.WORLD)
    gc.collect()
    dist.destroy_process_group()
    assert group() is None, "the group outlived destroy_process_group(): something still holds it"


def train(args: argparse.Namespace) -> None:
    """Train (from the checkpoint ``--resume`` names, if any) until ``--epochs``; log each step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    store = tsc.open_store(args.store)
    ds = StoreDataset(store, targets=np.arange(len(store)), as_float=True)
    sampler = StoreSampler(len(ds), global_batch_size=args.global_batch, seed=args.seed)
    assert (sampler.rank, sampler.world_size) == (rank, world)
    loader = ds.dataloader(sampler=sampler, num_workers=args.workers,
                           multiprocessing_context="fork" if args.workers else None)
    model = DistributedDataParallel(torch.nn.Linear(int(np.prod(ds[0][0].shape)), 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location="cpu", weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(json.loads(ckpt["data"]))
        step = int(ckpt["step"])
    log = open(Path(args.journal) / f"{args.name}-rank{rank}.jsonl", "a")  # noqa: SIM115
    saved = False
    for epoch in range(loader.epoch, args.epochs):
        for x, y in loader:
            target = y.to(torch.float32).unsqueeze(1) / len(ds)
            loss = torch.nn.functional.mse_loss(model(x.flatten(1)), target)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            log.write(json.dumps({"epoch": epoch, "step": step, "rows": y.tolist(),
                                  "pid": os.getpid()}) + "\n")
            log.flush()
            step += 1
            if saved:
                time.sleep(0.5)  # trained past the checkpoint; the test kills the job now
            if step == args.save_at:
                state = loader.state_dict()
                states: list[object] = [None] * world
                dist.all_gather_object(states, state)
                assert all(s == state for s in states), states  # the same on every rank
                if rank == 0:
                    tmp = Path(args.save + ".tmp")
                    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                                "data": json.dumps(state), "step": step}, tmp)
                    os.replace(tmp, args.save)
                dist.barrier()
                saved = True
    if rank == 0:
        torch.save(model.module.state_dict(), Path(args.journal) / f"{args.name}-final.pt")
    log.close()


if __name__ == "__main__":
    main()
