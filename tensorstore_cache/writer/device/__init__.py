"""The build by a batch loader: its device workers, and the batches sent to them.

A :class:`~tensorstore_cache.loaders.BatchLoader` is not sent to the build's
CPU workers: they run ``prepare`` on their keys and send the prepared items,
a batch at a time, to a device worker, one per distinct device, which runs
the loader. The parts, each a module:

* :mod:`.launch`: the build's device workers and the CPU workers beside
  them, started at once and stopped when the build ends;
* :mod:`.server`: a device worker, serving batches on its device;
* :mod:`.environment`: a device worker's process (its variables and allocator; like
  every worker, it exits without the interpreter's teardown: :mod:`..quick_exit`);
* :mod:`.stage`: what the CPU workers run, and the batches they send;
* :mod:`.results`: a batch's result, split into rows;
* :mod:`.first_batches`: the first batches, computed in the building process
  when they must tell what the loader returns.

The rest of the writer imports only the names listed here; the writer's
core (shard tasks, the pool) knows the stage only as a
:class:`~..tasks.BatchStage`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._interface import interface

if TYPE_CHECKING:
    from .environment import device_environment, keep_freed_memory
    from .first_batches import Pending, first_batch
    from .launch import devices_for
    from .stage import DeviceStage

#: Every name of the interface, by the module defining it.
_MODULES = {
    "environment": ("device_environment", "keep_freed_memory",),
    "first_batches": ("Pending", "first_batch",),
    "launch": ("devices_for",),
    "stage": ("DeviceStage",),
}

__all__ = [
    "DeviceStage",
    "Pending",
    "device_environment",
    "devices_for",
    "first_batch",
    "keep_freed_memory",
]

if not TYPE_CHECKING:  # a name is imported from its module when first used
    __getattr__, __dir__ = interface(__name__, _MODULES)
