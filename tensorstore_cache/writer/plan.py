"""A build planned: the spec of the store it makes, and what was computed to plan it.

The spec says what the shard tasks write: the item's shape and dtype (or the
schema of a store of records), declared or learnt by the probe
(:mod:`.probe`), and the shard layout (:mod:`.layout`), worked out here once
for the build.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from ..config import Recorded
from ..format import StoreSpec
from ..loaders import BatchLoader, Loader
from .device import DeviceStage, Pending
from .fields import record_spec
from .layout import rows_per_shard
from .options import BuildOptions
from .pool import BuildPool
from .probe import Probe, probe
from .tasks import Computed

__all__ = ["Plan", "per_key", "plan"]


def per_key(fn: Loader | BatchLoader) -> Loader:
    """A loader of one key (a batch loader is called by its device workers only)."""
    if isinstance(fn, BatchLoader):
        raise TypeError(f"{fn!r} is a BatchLoader: it runs in the build's device workers")
    return fn


@dataclass(frozen=True, slots=True)
class Plan:
    """A build planned: what it makes, how, and the items computed to plan it."""

    spec: StoreSpec
    """The store the build makes (``rows_per_shard``: its shard layout)."""
    keys: list[str]
    """The keys, in row order."""
    options: BuildOptions
    """How to build."""
    workers: int
    """The build's worker processes."""
    label: str
    """The build's target, as messages name it."""
    computed: Computed
    """Items computed already, by row."""
    pending: Pending | None
    """A batch loader's items still being computed (taken by the building process)."""
    stage: DeviceStage | None
    """A batch loader's stage, run by the shard tasks."""
    pool: BuildPool | None
    """The CPU workers started with a batch loader's device workers."""

    def loader(self) -> Loader | DeviceStage:
        """What the shard tasks run: the stage of a batch loader, or the loader of one key."""
        return self.stage if self.stage is not None else per_key(self.options.loader.fn)


def plan(
    keys: list[str], options: BuildOptions, label: str, workers: int,
    started: tuple[DeviceStage | None, BuildPool | None] = (None, None),
) -> Plan:
    """Plan the build of ``keys`` by ``workers`` processes, probing the loader if need be.

    Parameters
    ----------
    keys
        The build's keys, in row order.
    options
        How to build.
    label
        The build's target, as messages name it.
    workers
        The build's worker processes.
    started
        A batch loader's stage and the pool of CPU workers started beside its
        device workers (see :func:`~.device.devices_for`).

    Raises
    ------
    ValueError
        If nothing says what the loader returns and there is no key to ask it.
    BuildError
        If the loader fails on every key it is asked (see :func:`~.probe.probe`).
    """
    stage, pool = started
    item_shape, schema = options.loader.item_shape, options.schema
    found = Probe({}, None, None, None)
    if schema is None and (item_shape is None or options.names is not None):
        if not keys:
            raise ValueError(
                "no paths to build and the loader does not declare its item_shape; pass at "
                "least one path or give the loader an item_shape attribute"
            )
        found = probe(keys, options, label,
                      stage if stage is not None else per_key(options.loader.fn))
        schema = found.schema
        item_shape = found.shape if schema is None else item_shape
    batch = options.batch_size if stage is not None else 1
    if schema is not None:
        info = options.loader
        spec = record_spec(len(keys), schema, loader_id=info.loader_id, params=info.params,
                           workers=workers, shard_bytes=options.shard_bytes, batch=batch)
    else:
        assert item_shape is not None
        spec = _tensor_spec(len(keys), tuple(item_shape), options, workers, batch)
    spec = dataclasses.replace(spec, identity=_recorded(options))
    return Plan(spec, keys, options, workers, label, found.computed, found.pending, stage, pool)


def _tensor_spec(
    n: int, item_shape: tuple[int, ...], options: BuildOptions, workers: int, batch: int
) -> StoreSpec:
    """The spec of a store of ``n`` tensors of ``item_shape``."""
    dtype = np.dtype(options.dtype)
    return StoreSpec(
        n=n,
        item_shape=item_shape,
        dtype=dtype.name,
        loader_id=options.loader.loader_id,
        loader_params=options.loader.params,
        rows_per_shard=rows_per_shard(n, int(np.prod(item_shape)) * dtype.itemsize, workers,
                                      options.shard_bytes, batch),
        created_unix=time.time(),
    )


def _recorded(options: BuildOptions) -> Recorded:
    """What the store's metadata records: a ``"content"`` build records each source's stat
    (its content hashes lie beside a cache's part)."""
    return "stat" if options.identity == "content" else options.identity
