"""The last shards of a build, cut into pieces that any of its processes computes.

One process writes a shard, so a build whose every task is a whole shard ends
when its slowest process ends its last shard: the others wait for up to a
shard's time (0.007-0.115 s of a 1.7 s build of 10,000 covers in the committed
cold timeline, ``docs/benchmarks.md``). The scheduler (:mod:`.schedule`) cuts
the shards left near the end into :class:`Piece` s of a few rows each instead:
a piece is computed by whichever process takes it (:func:`run_piece`), which
returns its rows, and the building process writes a shard once all its
pieces are back (:class:`Tail`), through the same :func:`~.tasks.run_shard` as
any shard whose rows were computed before its task ran. The processes then
end at most a piece apart.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..loaders import Loader
from .tasks import (
    BatchStage,
    Computed,
    Failure,
    ShardResult,
    ShardTask,
    checker,
    compute,
    run_shard,
)

__all__ = ["PIECES_PER_SHARD", "Piece", "Tail", "run_piece", "run_unit"]

#: Pieces a shard is cut into (none of fewer than :data:`MIN_PIECE_ROWS` rows).
PIECES_PER_SHARD = 8
#: The fewest rows of a piece: each piece is a round trip to a worker.
MIN_PIECE_ROWS = 8


@dataclass(slots=True)
class Piece:
    """Rows ``start`` to ``start + len(task.keys)`` of a shard task.

    ``task`` is the shard's task narrowed to those rows (its keys, version
    tokens and items computed already); its ``rel`` names the shard.
    """

    task: ShardTask
    start: int


def run_piece(piece: Piece, loader: Loader | BatchStage | None = None) -> Computed:
    """Compute the rows of ``piece`` (with ``loader``, or the task's own), by row in its shard.

    Each row is its checked value (a copy, as a shard's task copies it into its
    block), or the :class:`~.tasks.Failure` of its key, with its source identity
    taken before it was read, as the shard's task would have taken them.
    """
    task = piece.task
    fn = loader if loader is not None else task.loader
    if fn is None:
        raise ValueError(f"a piece of shard task {task.rel} has no loader")
    rows: dict[int, object] = {}

    def keep(i: int, row: Any) -> None:  # a copy: a loader may refill one buffer every call
        rows[i] = ({name: np.array(v) for name, v in row.items()} if isinstance(row, dict)
                   else np.array(row))

    result = ShardResult(task.rel)
    compute(task, fn, checker(task), keep, result)
    for i, reason, frames in result.failures:
        rows[i] = Failure(reason, frames)
    identities = zip(result.source_size, result.source_mtime_ns, result.source_hash, strict=True)
    return {piece.start + i: (rows[i], identity) for i, identity in enumerate(identities)}


def run_unit(
    unit: ShardTask | Piece, loader: Loader | BatchStage | None = None
) -> ShardResult | Computed:
    """Run a shard task (its result) or compute a piece of one (its rows), with ``loader``
    or the task's own: what a build's processes run, wherever they run it."""
    if isinstance(unit, Piece):
        return run_piece(unit, loader)
    return run_shard(unit, loader)


class Tail:
    """The shards cut into pieces, and the rows of each computed so far."""

    __slots__ = ("_left", "_rows", "_tasks")

    def __init__(self) -> None:
        self._tasks: dict[str, ShardTask] = {}
        self._left: dict[str, int] = {}
        self._rows: dict[str, Computed] = {}

    def cut(self, tasks: list[ShardTask]) -> list[ShardTask | Piece]:
        """The pieces of ``tasks``, shard after shard, each shard's in row order; a shard of
        fewer than two pieces' rows stays whole (one piece would only add a round trip)."""
        pieces: list[ShardTask | Piece] = []
        for task in tasks:
            m = len(task.keys)
            if m < 2 * MIN_PIECE_ROWS:
                pieces.append(task)
                continue
            step = max(MIN_PIECE_ROWS, math.ceil(m / PIECES_PER_SHARD))
            cut = [Piece(_narrowed(task, a, min(a + step, m)), a) for a in range(0, m, step)]
            self._tasks[task.rel], self._left[task.rel] = task, len(cut)
            self._rows[task.rel] = {}
            pieces.extend(cut)
        return pieces

    def add(self, piece: Piece, rows: Computed) -> ShardTask | None:
        """Note the ``rows`` of ``piece``; its shard's task with every row computed once this
        was its last piece (the building process writes it), else None."""
        rel = piece.task.rel
        self._rows[rel].update(rows)
        self._left[rel] -= 1
        if self._left[rel]:
            return None
        del self._left[rel]
        return dataclasses.replace(self._tasks.pop(rel), computed=self._rows.pop(rel))


def _narrowed(task: ShardTask, start: int, stop: int) -> ShardTask:
    """``task`` narrowed to its rows ``start`` to ``stop``."""
    return dataclasses.replace(
        task, keys=task.keys[start:stop],
        tokens=None if task.tokens is None else task.tokens[start:stop],
        computed={i - start: done for i, done in task.computed.items() if start <= i < stop},
    )
