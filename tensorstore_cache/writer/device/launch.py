"""A batched build's processes: its device workers, and the CPU workers beside them.

:func:`devices_for` starts one device worker per distinct device (a
:class:`~..pool.BuildPool` of their own, :mod:`.server`) and, for a build of
several shards, the pool of CPU workers that prepare the keys and send them
to the device workers (:class:`~.stage.DeviceStage`), all at once, so that
they start while the building process computes the first batch
(:mod:`.first_batches`); when the build ends, it stops them all, the device
workers joined (killed after :data:`DEVICE_EXIT_S`) so that a device's memory
is free again before the build returns.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ...errors import BuildError
from ...fs import discard_tree
from ...loaders import BatchLoader
from ..layout import fewest_rows
from ..options import BuildOptions
from ..pool import BuildPool
from ..schedule import daemonic
from .environment import device_environment
from .server import device_worker_setup, serve
from .stage import DeviceStage

__all__ = ["device_workers", "devices_for"]

#: Seconds a device worker may take to exit after its last batch before it is killed.
DEVICE_EXIT_S = 60.0
#: How long the builder waits for its device workers to listen (seconds).
START_TIMEOUT_S = 600.0


@contextlib.contextmanager
def device_workers(
    loader: BatchLoader, devices: tuple[str, ...], prepare: Callable[[str], Any] | None,
    batch_size: int, cpu_workers: int = 0,
) -> Iterator[tuple[DeviceStage, BuildPool | None]]:
    """Start one device worker per device, and ``cpu_workers`` CPU workers beside them; yield
    the stage the CPU workers run and their pool (None without any); stop them all.

    Returns at once: this process's first connection waits until every
    worker listens (its ``setup`` may still run then: batches wait for it).
    The CPU workers start now too, so that they are ready when the first
    batch has given the shape and the shards are planned. Device workers are
    started with :func:`~.environment.device_environment`.

    Parameters
    ----------
    loader
        The build's batch loader (sent to the device workers only).
    devices
        The distinct devices: one device worker each.
    prepare
        The per-key stage the CPU workers run (None: the items are the keys).
    batch_size
        Items per batch.
    cpu_workers
        The CPU workers to start beside them.

    Raises
    ------
    BuildError
        If a device worker could not start (its loader does not unpickle).
    """
    scratch = Path(tempfile.mkdtemp(prefix="tsc-dev-"))  # short: a socket path has 107 bytes
    os.chmod(scratch, 0o700)
    addresses = tuple(str(scratch / f"{d}.sock") for d in range(len(devices)))
    authkey = secrets.token_bytes(32)
    stage = DeviceStage(prepare, batch_size, devices, addresses, authkey)
    env = device_environment(os.environ)
    pools: list[BuildPool] = []
    try:
        pool = BuildPool(len(devices), loader, scratch, status_dir=scratch / "status", env=env,
                         setup=device_worker_setup)
        pools.append(pool)
        futures = [pool.call(serve, device, address, authkey, status=f"device {device}")
                   for device, address in zip(devices, addresses, strict=True)]
        if cpu_workers > 0:
            pools.append(BuildPool(cpu_workers, stage, scratch, status_dir=scratch / "cpu"))
        stage.connect_after(lambda: _wait_listening(futures, addresses, devices))
        yield stage, pools[1] if len(pools) > 1 else None
        stage.wait_started()  # never connected otherwise
        stage.close()
        stage.stop()
        for future in futures:
            future.result()
        # the CPU workers and the device workers exit side by side; a device's memory is
        # free again before the build returns (another build may need it)
        for each in pools:
            each.stop()
        for each in pools[1:]:
            each.close()
        pool.close(timeout=DEVICE_EXIT_S)
    except BaseException:
        stage.close()
        for each in pools:
            each.abort()
        discard_tree(scratch)
        raise
    discard_tree(scratch)


@contextlib.contextmanager
def devices_for(
    options: BuildOptions, keys: list[str], workers: int
) -> Iterator[tuple[DeviceStage | None, BuildPool | None]]:
    """The device workers of a build by a batch loader, and the pool of its ``workers - 1``
    CPU workers when the build will need one (both None for a loader of one key, or no key to
    build), stopped when the block ends.

    Parameters
    ----------
    options
        How to build (its loader, and a batch loader's options).
    keys
        The keys to build.
    workers
        The build's worker processes (this one among them).
    """
    fn = options.loader.fn
    if not isinstance(fn, BatchLoader) or not keys:
        yield None, None
        return
    # the CPU workers of a build of several shards (see run_tasks): one fewer than its shards
    # at most, counting shards of the fewest rows a batched build's shard has (started before
    # the first batch gives the item's size, which the shard length depends on)
    shards = math.ceil(len(keys) / fewest_rows(len(keys), options.batch_size))
    cpu = min(workers, shards) - 1 if options.executor is None and not daemonic() else 0
    with device_workers(fn, options.devices, options.prepare, options.batch_size,
                        cpu) as started:
        yield started


def _wait_listening(
    futures: list[Future[None]], addresses: tuple[str, ...], devices: tuple[str, ...]
) -> None:
    """Wait until every device worker listens at its address, or raise why one never will."""
    deadline = time.monotonic() + START_TIMEOUT_S
    for future, address, device in zip(futures, addresses, devices, strict=True):
        while not os.path.exists(address):
            if future.done():
                exc = future.exception()
                raise BuildError(
                    f"the device worker of {device!r} could not start, so nothing was "
                    f"published: {type(exc).__name__}: {exc}\nA loader that can be imported by "
                    "name is sent to it by reference: its module must import in a fresh Python "
                    "process (installed, or on sys.path) and must not fail at import"
                )
            if time.monotonic() > deadline:
                raise BuildError(
                    f"the device worker of {device!r} did not start within "
                    f"{START_TIMEOUT_S:.0f} s; nothing was published"
                )
            time.sleep(0.01)
