"""A build by a batch loader: its device workers started and stopped, and the first batch
that gives the shape.

Nothing of a :class:`~tensorstore_cache.loaders.BatchLoader` runs in the
building process: when neither ``fields=`` nor the loader's ``item_shape``
says what it returns, the first batch (prepared here, computed by a device
worker) does, and its rows are stored as they came.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..config import Recorded
from ..loaders import BatchLoader, Loader, LoaderInfo
from .batches import compute_rows
from .devices import DeviceStage, wait_listening
from .pool import BuildPool
from .records import Schema, check_record, infer_schema, is_record
from .tasks import ShardTask, check_item, source_identity

__all__ = ["device_workers", "devices_for", "first_batch", "per_key"]

#: Seconds a device worker may take to exit after its last batch before it is killed.
DEVICE_EXIT_S = 60.0
#: Batches the building process prepares and queues at most while it waits for the first
#: answer of a device worker (which may be importing its framework and loading its model).
FIRST_BATCHES = 8


class Options(Protocol):
    """What a batched build reads of its :class:`~.builder.BuildOptions`."""

    @property
    def loader(self) -> LoaderInfo: ...
    @property
    def dtype(self) -> str: ...
    @property
    def names(self) -> tuple[str, ...] | None: ...
    @property
    def hash_sources(self) -> bool: ...
    @property
    def identity(self) -> Recorded: ...
    @property
    def tokens(self) -> Mapping[str, int] | None: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def prepare(self) -> Callable[[str], Any] | None: ...
    @property
    def devices(self) -> tuple[str, ...]: ...


@contextlib.contextmanager
def device_workers(
    loader: BatchLoader, devices: tuple[str, ...], prepare: Callable[[str], Any] | None,
    batch_size: int,
) -> Iterator[DeviceStage]:
    """Start one device worker per device; yield the stage the CPU workers run; stop them.

    Returns at once: this process's first connection waits until every
    worker listens (its ``setup`` may still run then: batches wait for it).

    Raises
    ------
    BuildError
        If a device worker could not start (its loader does not unpickle).
    """
    scratch = Path(tempfile.mkdtemp(prefix="tsc-dev-"))  # short: a socket path has 107 bytes
    os.chmod(scratch, 0o700)
    addresses = tuple(str(scratch / f"{d}.sock") for d in range(len(devices)))
    authkey = secrets.token_bytes(32)
    try:
        pool = BuildPool(len(devices), loader, scratch, status_dir=scratch / "status")
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    stage = DeviceStage(prepare, batch_size, devices, addresses, authkey)
    try:
        futures = [pool.serve(device, address, authkey)
                   for device, address in zip(devices, addresses, strict=True)]
        stage._started = lambda: wait_listening(futures, addresses, devices)
        yield stage
        stage.wait_started()  # never connected otherwise
        stage.close()
        stage.stop()
        for future in futures:
            future.result()
    except BaseException:
        stage.close()
        pool.abort()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    # a device's memory is free again before the build returns (another build may need it)
    pool.close(timeout=DEVICE_EXIT_S)
    shutil.rmtree(scratch, ignore_errors=True)



@contextlib.contextmanager
def devices_for(options: Options, keys: list[str]) -> Iterator[DeviceStage | None]:
    """The device workers of a build by a batch loader (None for a loader of one key, or no
    key to build), stopped when the block ends."""
    fn = options.loader.fn
    if not isinstance(fn, BatchLoader) or not keys:
        yield None
        return
    with device_workers(fn, options.devices, options.prepare, options.batch_size) as stage:
        yield stage


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


def first_batch(
    stage: DeviceStage, keys: list[str], options: Options
) -> tuple[dict[int, tuple[Any, tuple[int, int, int]]], Schema | None, tuple[int, ...] | None]:
    """Compute batches from the first key on, until one item succeeds; return every item
    computed by row (its value or :class:`~.batches.Failure`, and its source identity; kept,
    and stored as it is), with the schema or item shape the first success gives (both None
    if every key failed). The items are prepared here, up to :data:`FIRST_BATCHES` batches
    ahead while the first answer is awaited; the loader runs on the first device worker."""
    infer = _Inferred(np.dtype(options.dtype), options.names)
    computed: dict[int, tuple[Any, tuple[int, int, int]]] = {}
    start = 0
    while start < len(keys):
        chunk = keys[start : start + FIRST_BATCHES * stage.batch_size]
        probe = ShardTask(root="", rel="", keys=chunk, loader=None, dtype="", item_shape=(),
                          rows_per_shard=1, write_on_failure=False,
                          hash_sources=options.hash_sources, identity=options.identity,
                          tokens=None if options.tokens is None or options.identity != "token"
                          else [options.tokens[k] for k in chunk])
        identities = [source_identity(probe, i, key) for i, key in enumerate(chunk)]
        # while the device worker starts (imports, setup), batches are prepared and queued
        rows = compute_rows(stage, chunk, 0, infer, options.names, depth=FIRST_BATCHES,
                            enough=lambda: infer.schema is not None or infer.shape is not None)
        for i, (row, identity) in enumerate(zip(rows, identities, strict=False)):
            computed[start + i] = (row, identity)
        start += len(rows)
        if infer.schema is not None or infer.shape is not None:
            return computed, infer.schema, infer.shape
    return computed, None, None
