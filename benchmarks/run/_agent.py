"""The agent process: what one sweep agent does with its cache, measured.

:func:`agent_main` runs in a fresh process started with the ``spawn`` context (a new
interpreter, like a sweep agent). It imports the method's libraries, reads its list of
unique paths, then runs the tasks of its job in this order:

``load``
    ``Method.load``: time until the agent holds the column of every path (building
    included when the cache is empty), and the CPU seconds it took (this process's and
    its reaped children's). It starts right after a full collection of the garbage
    collector: a collection that the agent's own setup made due would otherwise land inside
    a short load (an open) and traverse the agent's list of every path, a cost that grows
    with the paths and is not the method's.
``full_pass``
    read every vector once.
``hold``
    report ``ready`` and wait: the driver measures memory of all agents holding their
    column at the same time, then says ``go``.
``verify``
    write ``column.batch(sample rows)`` to a ``.npy`` file for the driver to compare.
``lookups`` / ``batches``
    single lookups by path / random batches of 256 rows, for a time budget; rates (and, for
    the batches, how much of the files the agent maps lay on huge pages).
``dataloader``
    one epoch of a torch DataLoader (``num_workers=2``, batch 256, shuffled).

A ``baseline`` job imports the same libraries and reads the same paths, then holds:
memory growth is reported over it.

Every agent first sets its ``oom_score_adj`` to 1000: when a round needs more memory
than the machine has, the kernel's OOM killer takes an agent, and the driver records
that as the round's result.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import resource
import sys
import time
import traceback
from typing import Any

import numpy as np

BATCH = 256
COMMON_MODULES = ("numpy", "PIL.Image", "tensorstore_cache.loaders")
DATALOADER_CONTEXT = "fork" if sys.platform == "linux" and sys.version_info < (3, 14) else None


def _rate(fn: Any, args: list[Any], budget_s: float, max_calls: int) -> dict[str, float]:
    """Call ``fn(a)`` for ``a`` cycling over ``args`` until the budget or count is used.

    The clock is read after chunks of calls that grow from 1 to 64, so slow calls stop
    near the budget and fast ones are not dominated by reading the clock.
    """
    for a in args[:3]:  # warm up
        fn(a)
    calls = 0
    chunk = 1
    n = len(args)
    t0 = time.perf_counter()
    elapsed = 0.0
    while calls < max_calls:
        start = calls % n
        part = args[start : start + chunk]
        for a in part:
            fn(a)
        calls += len(part)
        chunk = min(64, chunk * 2)
        elapsed = time.perf_counter() - t0
        if elapsed >= budget_s:
            break
    return {"calls": calls, "seconds": elapsed, "per_s": calls / elapsed if elapsed else 0.0}


def _count(batch: Any) -> int:
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    elif isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0])


def _dataloader_epoch(column: Any) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    # The agent was started with the spawn context, which makes spawn this process's
    # default too; a training script started as a fresh interpreter gets the platform's
    # default, which is fork on Linux with Python < 3.14.
    loader = column.dataloader(BATCH, 2, DATALOADER_CONTEXT)
    t0 = time.perf_counter()
    items = 0
    for batch in loader:
        items += _count(batch)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "items": items, "items_per_s": items / seconds if seconds else 0.0}


def _cpu() -> float:
    """CPU seconds (user and system) of this process and of its children it has reaped
    (the worker processes of a build or a ``map``, once they have exited)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _file_pmd_mapped_kib() -> int | None:
    """KiB of files this process maps as whole huge pages (``FilePmdMapped`` in
    ``/proc/self/smaps_rollup``): a method's data files and its libraries, on 2 MiB pages
    (None: not Linux)."""
    from benchmarks.common._memory import rollup

    mapped = (rollup("self") or {}).get("FilePmdMapped")
    return None if mapped is None else mapped // 1024


def _line_offset(batch: Any) -> int | None:
    """Bytes from the 64-byte cache line on which a batch's data starts (None: not an array)."""
    interface = getattr(batch, "__array_interface__", None)
    return None if interface is None else int(interface["data"][0]) % 64


def _oom_score_adj() -> int | None:
    """This process's ``oom_score_adj`` as the kernel has it (None: not Linux)."""
    try:
        with open("/proc/self/oom_score_adj", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def agent_main(job: dict[str, Any], conn: Any) -> None:
    """Run one agent job; send results through ``conn`` (a Pipe end)."""
    result: dict[str, Any] = {"pid": os.getpid()}
    try:
        from benchmarks.common import methods
        from benchmarks.common._memory import set_oom_score_adj

        # the kernel kills an agent first when memory runs out, never the driver or
        # anything else on the machine (the agent's own worker processes inherit it)
        set_oom_score_adj(1000)
        result["oom_score_adj"] = _oom_score_adj()

        method = methods.get(job["method"])
        t0 = time.perf_counter()
        for name in (*COMMON_MODULES, *getattr(method, "modules", ())):
            importlib.import_module(name)
        result["import_s"] = time.perf_counter() - t0
        with open(job["paths_file"], encoding="utf-8") as f:
            paths = f.read().split("\n")
        if paths == [""]:
            paths = []
        tasks = job["tasks"]
        conn.send(("imported", result))
        conn.recv()  # start: every agent of the round has imported its libraries
        if "baseline" in tasks:
            conn.send(("ready", result))
            conn.recv()
            conn.send(("done", result))
            return
        loader = None
        if job.get("synthetic"):
            from benchmarks.common.methods._base import SyntheticLoader

            loader = SyntheticLoader()
        gc.collect()  # the collection the setup made due is not the method's (see above)
        cpu0 = _cpu()
        t0 = time.perf_counter()
        column = method.load(job["state"], paths, loader)
        result["load_s"] = time.perf_counter() - t0
        result["load_cpu_s"] = _cpu() - cpu0
        result["open_s"] = column.open_s
        result["hit"] = column.hit
        result["n"] = column.n
        if "full_pass" in tasks:
            t0 = time.perf_counter()
            result["checksum"] = column.full_pass()
            result["full_pass_s"] = time.perf_counter() - t0
        if "hold" in tasks:
            conn.send(("ready", result))
            conn.recv()
        t_after_hold = time.perf_counter()
        rng = np.random.default_rng(job.get("seed", 0))
        if "verify" in tasks:
            rows = np.asarray(job["verify_rows"], dtype=np.int64)
            np.save(job["verify_file"], np.ascontiguousarray(column.batch(rows)))
        budget = float(job.get("budget_s", 1.0))
        if "lookups" in tasks and column.n:
            picks = rng.integers(0, column.n, min(100_000, max(1000, column.n)))
            args = [paths[i] for i in picks.tolist()]
            result["lookups"] = _rate(column.lookup, args, budget, job.get("max_lookups", 2_000_000))
        if "batches" in tasks and column.n:
            size = min(BATCH, column.n)
            batches = [rng.choice(column.n, size, replace=False) for _ in range(64)]
            stats = _rate(column.batch, batches, budget, job.get("max_batches", 100_000))
            stats["items_per_s"] = stats["per_s"] * size
            # where a batch lands once the timed ones have left the heap as they do: its
            # data's offset from a 64-byte cache line
            probe = column.batch(batches[0])
            result["batches"] = {**stats, "file_pmd_mapped_kib": _file_pmd_mapped_kib(),
                                 "line_offset": _line_offset(probe)}
            del probe
        if "dataloader" in tasks and column.n:
            result["dataloader"] = _dataloader_epoch(column)
        result["after_hold_s"] = time.perf_counter() - t_after_hold
        column.close()
        conn.send(("done", result))
    except BaseException:  # report everything, including KeyboardInterrupt in the agent
        result["error"] = traceback.format_exc()
        with contextlib.suppress(Exception):
            conn.send(("error", result))
    finally:
        conn.close()
