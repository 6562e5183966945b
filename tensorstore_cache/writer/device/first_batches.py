"""The first batches of a batched build: computed until one item says what the loader returns.

Nothing of a :class:`~tensorstore_cache.loaders.BatchLoader` runs in the
building process: when neither ``fields=`` nor the loader's ``item_shape``
says what it returns, the first batch (prepared here, computed by a device
worker) does, and its rows are stored as they came.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..tasks import Computed, SourceStat
from .stage import BatchRun, DeviceStage

__all__ = ["FIRST_BATCHES", "FIRST_BYTES", "Pending", "first_batch"]

#: Batches the building process prepares and queues at most while it waits for the first
#: answer of a device worker (which may be importing its framework and loading its model).
FIRST_BATCHES = 32
#: Bytes of prepared items it queues at most meanwhile (fewer batches of large items).
FIRST_BYTES = 256 << 20


class Pending:
    """The batches of a first batch's chunk still being computed when the shape was known:
    their answers are taken by :meth:`finish`, in this process, before it sends anything
    else to the device worker."""

    def __init__(self, run: BatchRun, start: int, identities: list[SourceStat]) -> None:
        self.run, self.start, self.identities = run, start, identities

    @property
    def rows(self) -> range:
        """The build's rows whose items are being computed."""
        return range(self.start, self.start + self.run.sent)

    def finish(self) -> Computed:
        """Every row of the chunk, by build row: its value or failure, and source identity."""
        rows = self.run.finish()
        return {self.start + i: (row, self.identities[i]) for i, row in enumerate(rows)}


def first_batch(
    stage: DeviceStage,
    keys: list[str],
    check: Callable[[str, Any], Any],
    known: Callable[[], bool],
    identify: Callable[[str], SourceStat],
    names: tuple[str, ...] | None,
) -> tuple[Computed, Pending | None]:
    """Compute batches until ``known()``; return every item computed by row (its value or
    :class:`~..tasks.Failure`, and its source identity; kept, and stored as it is) and the
    batches still computing then (None if none, or if every key failed).

    The keys are taken in chunks of :data:`FIRST_BATCHES` batches from the
    last chunk back (in key order within a chunk, in the batches a shard
    would make of them): their rows belong to the last shards, which this
    process builds first while the pool's workers take the first ones. The
    items are prepared here, up to the whole chunk ahead while the first
    answer is awaited, each key's source identity taken just before; the
    loader runs on the first device worker.

    Parameters
    ----------
    stage
        The build's stage.
    keys
        The build's keys, in row order.
    check
        Checks each value (``check(key, value)`` returns what is stored); the
        first that passes tells what the loader returns.
    known
        Whether a value has told it.
    identify
        A key's source identity, taken before it is prepared.
    names
        The field names of a loader's tuples, in order.
    """
    computed: Computed = {}
    batch = stage.batch_size
    end = len(keys)
    while end > 0:  # chunks start on a multiple of the batch, as the shards' batches do
        start = max(0, (end - FIRST_BATCHES * batch) // batch * batch)
        chunk = keys[start:end]
        identities: list[SourceStat] = []  # of the keys sent: taken as each is

        def before(i: int, chunk: list[str] = chunk,
                   identities: list[SourceStat] = identities) -> None:
            identities.append(identify(chunk[i]))

        # while the device worker starts (imports, setup), batches are prepared and queued
        run = BatchRun(stage, chunk, 0, check, names, depth=FIRST_BATCHES,
                       max_bytes=FIRST_BYTES)
        run.send(enough=known, before=before)
        while not known() and run.take():  # the answers one by one, up to the first success
            pass
        if known():
            return computed, Pending(run, start, identities)
        computed.update(Pending(run, start, identities).finish())
        end = start
        if known():
            return computed, None
    return computed, None
