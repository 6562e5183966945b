"""A build by a batch loader: its device workers started and stopped, and the first batch
that gives the shape.

Nothing of a :class:`~tensorstore_cache.loaders.BatchLoader` runs in the
building process: when neither ``fields=`` nor the loader's ``item_shape``
says what it returns, the first batch (prepared here, computed by a device
worker) does, and its rows are stored as they came.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .. import config
from ..fs import discard_tree
from ..loaders import BatchLoader, Loader
from .batches import BatchRun
from .devices import DeviceStage, wait_listening
from .options import BuildOptions
from .pool import BuildPool
from .records import Schema, check_record, infer_schema, is_record
from .schedule import daemonic
from .tasks import ShardTask, check_item, source_identity

__all__ = ["Pending", "device_environment", "device_workers", "devices_for", "first_batch", "per_key"]

#: Seconds a device worker may take to exit after its last batch before it is killed.
DEVICE_EXIT_S = 60.0
#: Batches the building process prepares and queues at most while it waits for the first
#: answer of a device worker (which may be importing its framework and loading its model).
FIRST_BATCHES = 32
#: Bytes of prepared items it queues at most meanwhile (fewer batches of large items).
FIRST_BYTES = 256 << 20


def device_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a device worker is started with besides ``environ``'s.

    ``OMP_WAIT_POLICY=PASSIVE`` unless ``environ`` sets it: the worker's
    OpenMP threads (torch's on ``"cpu"``) sleep rather than spin while they
    wait, leaving the cores to the CPU workers that prepare. (The worker's
    allocator is set up in the worker: :func:`~.devices.keep_freed_memory`.)

    Parameters
    ----------
    environ
        The building process's environment.

    Returns
    -------
    dict
        Variable -> value, none of them set in ``environ``.
    """
    return {} if "OMP_WAIT_POLICY" in environ else {"OMP_WAIT_POLICY": "PASSIVE"}


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
    started with :func:`device_environment`.

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
                         devices=True)
        pools.append(pool)
        futures = [pool.serve(device, address, authkey)
                   for device, address in zip(devices, addresses, strict=True)]
        if cpu_workers > 0:
            pools.append(BuildPool(cpu_workers, stage, scratch, status_dir=scratch / "cpu",
                                   start=True))
        stage._started = lambda: wait_listening(futures, addresses, devices)
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
    build), stopped when the block ends."""
    fn = options.loader.fn
    if not isinstance(fn, BatchLoader) or not keys:
        yield None, None
        return
    # the CPU workers of a build of several shards (see run_tasks): one fewer than its shards
    # at most, counting shards of the fewest rows a batched build's shard has
    shards = math.ceil(len(keys) / max(config.MIN_SHARD_ROWS, options.batch_size))
    cpu = min(workers, shards) - 1 if options.executor is None and not daemonic() else 0
    with device_workers(fn, options.devices, options.prepare, options.batch_size,
                        cpu) as started:
        yield started


def per_key(fn: Loader | BatchLoader) -> Loader:
    """A loader of one key (a batch loader is called by its device workers only)."""
    if isinstance(fn, BatchLoader):
        raise TypeError(f"{fn!r} is a BatchLoader: it runs in the build's device workers")
    return fn


class _Inferred:
    """Checks the rows of a first batch: the first one that passes gives the schema or shape."""

    def __init__(self, dtype: np.dtype[Any], names: tuple[str, ...] | None) -> None:
        self.dtype = dtype
        self.names = names
        self.schema: Schema | None = None
        self.shape: tuple[int, ...] | None = None

    def known(self) -> bool:
        """Whether a row gave the schema or shape."""
        return self.schema is not None or self.shape is not None

    def __call__(self, key: str, value: Any) -> Any:
        if self.schema is not None:
            return check_record(key, value, self.schema, self.names)
        if self.shape is not None:
            return check_item(value, self.dtype, self.shape)
        if self.names is not None or is_record(value):
            schema = infer_schema(key, value, self.names)
            checked = check_record(key, value, schema, self.names)
            self.schema = schema
            return checked
        item = check_item(value, self.dtype, None)
        self.shape = tuple(item.shape)
        return item


class Pending:
    """The batches of a first batch's chunk still being computed when the shape was known:
    their answers are taken by :meth:`finish`, in this process, before it sends anything
    else to the device worker."""

    def __init__(self, run: BatchRun, start: int,
                 identities: list[tuple[int, int, int]]) -> None:
        self.run, self.start, self.identities = run, start, identities

    @property
    def rows(self) -> range:
        """The build's rows whose items are being computed."""
        return range(self.start, self.start + self.run.sent)

    def finish(self) -> dict[int, tuple[Any, tuple[int, int, int]]]:
        """Every row of the chunk, by build row: its value or failure, and source identity."""
        rows = self.run.finish()
        return {self.start + i: (row, self.identities[i]) for i, row in enumerate(rows)}


def first_batch(
    stage: DeviceStage, keys: list[str], options: BuildOptions
) -> tuple[dict[int, tuple[Any, tuple[int, int, int]]], Pending | None, Schema | None,
           tuple[int, ...] | None]:
    """Compute batches until one item succeeds; return every item computed by row (its value
    or :class:`~.batches.Failure`, and its source identity; kept, and stored as it is), the
    batches still computing then (None if none), and the schema or item shape the first
    success gives (both None if every key failed).

    The keys are taken in chunks of :data:`FIRST_BATCHES` batches from the
    last chunk back (in key order within a chunk, in the batches a shard
    would make of them): their rows belong to the
    last shards, which this process builds first while the pool's workers
    take the first ones. The items are prepared here, up to the whole chunk
    ahead while the first answer is awaited, each key's source identity taken
    just before; the loader runs on the first device worker."""
    infer = _Inferred(np.dtype(options.dtype), options.names)
    computed: dict[int, tuple[Any, tuple[int, int, int]]] = {}
    batch = stage.batch_size
    end = len(keys)
    while end > 0:  # chunks start on a multiple of the batch, as the shards' batches do
        start = max(0, (end - FIRST_BATCHES * batch) // batch * batch)
        chunk = keys[start:end]
        probe = ShardTask(root="", rel="", keys=chunk, loader=None, dtype="", item_shape=(),
                          rows_per_shard=1, write_on_failure=False,
                          identity=options.identity,
                          tokens=None if options.tokens is None or options.identity != "token"
                          else [options.tokens[k] for k in chunk])
        identities: list[tuple[int, int, int]] = []  # of the keys sent: taken as each is

        def identify(i: int, probe: ShardTask = probe, chunk: list[str] = chunk,
                     identities: list[tuple[int, int, int]] = identities) -> None:
            identities.append(source_identity(probe, i, chunk[i]))

        # while the device worker starts (imports, setup), batches are prepared and queued
        run = BatchRun(stage, chunk, 0, infer, options.names, depth=FIRST_BATCHES,
                       max_bytes=FIRST_BYTES)
        known = infer.known
        run.send(enough=known, before=identify)
        while not known() and run.take():  # the answers one by one, up to the first success
            pass
        if known():
            return computed, Pending(run, start, identities), infer.schema, infer.shape
        computed.update(Pending(run, start, identities).finish())
        end = start
        if known():
            return computed, None, infer.schema, infer.shape
    return computed, None, None, None
