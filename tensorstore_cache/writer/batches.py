"""The rows of a shard computed in batches: ``prepare`` here, the batch loader on a device.

A shard task of a batched build prepares its keys in key order, sends them
to its device worker (:mod:`.devices`) ``batch_size`` at a time (the last
batch of a shard may be shorter), keeps one batch queued behind the one
computing, and splits every result into rows. A result must have one row
per item: an array whose leading dimension is the batch's length, or a
dict of field name -> such an array (a list of arrays, or a
:class:`~tensorstore_cache.Ragged` batch, for a ragged field; a list of
``str`` for a text field). Anything else fails the build, naming the
batch's first key. A batch whose call raises is sent again key by key, so
that every failing key is named and ``on_error="skip"`` skips only those.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BuildError
from ..format import Ragged
from .devices import DeviceStage
from .frames import loader_frames

__all__ = ["BatchRun", "Failure", "Row", "compute_rows"]


@dataclass(frozen=True, slots=True)
class Failure:
    """A key the build could not compute: why (``"Type: message"``) and the loader's frames."""

    reason: str
    frames: str


#: A row of a shard task: its value (checked) or its failure.
Row = Any


def _rows(result: Any, n: int, first: str, names: tuple[str, ...] | None) -> list[Any]:
    """Split a batch's result into its ``n`` rows (a record: a dict per row).

    Raises
    ------
    BuildError
        If the result does not have one row per item, naming the batch's first key.
    """
    def wrong(what: str) -> BuildError:
        return BuildError(
            f"the batch loader returned {what} for a batch of {n} items from {first!r}; a "
            "BatchLoader returns one row per item, in order: an array whose leading dimension "
            "is len(items), or a dict of such arrays (a list of arrays for a ragged field)"
        )

    if isinstance(result, tuple) and names is not None:
        if len(result) != len(names):
            raise wrong(f"a tuple of {len(result)} fields (fields= names {len(names)})")
        result = dict(zip(names, result, strict=True))
    if isinstance(result, Mapping):
        columns: dict[str, Any] = {}
        for name, column in result.items():
            rows: Any
            if isinstance(column, (Ragged, list, tuple)):
                rows = list(column)
            else:
                rows = np.asarray(column)
                if rows.ndim == 0:
                    raise wrong(f"a scalar for field {name!r}")
            if len(rows) != n:
                raise wrong(f"{len(rows)} rows of field {name!r}")
            columns[str(name)] = rows
        return [{name: rows[i] for name, rows in columns.items()} for i in range(n)]
    try:
        array = np.asarray(result)
    except ValueError:  # rows of different shapes: a ragged result outside a dict
        raise wrong(f"rows of different shapes ({type(result).__name__}); a ragged field "
                    "goes in a dict of fields") from None
    if array.ndim == 0 or array.shape[0] != n:
        shape = "a scalar" if array.ndim == 0 else f"leading dimension {array.shape[0]}"
        raise wrong(f"{shape} (shape {array.shape})")
    return list(array)


class BatchRun:
    """The rows of ``keys`` computed in batches on device worker ``device``, in key order:
    each its value, checked by ``check(key, value)``, or a :class:`Failure` (of
    ``prepare``, of the loader on the key alone, or of ``check``).

    :meth:`send` prepares the keys and sends them ``stage.batch_size`` at a
    time; up to ``depth`` batches stay queued behind the one computing (with
    ``max_bytes``, fewer if the first batch's items say that so many would
    hold more bytes), and every answer is taken as soon as it is there. :meth:`finish` takes the
    answers still due (this process's connection answers in the order it
    asked: nothing else may be sent to that device worker from this process
    in between) and returns the rows. ``names`` orders the fields of a
    loader's tuples.
    """

    def __init__(
        self, stage: DeviceStage, keys: list[str], device: int,
        check: Callable[[str, Any], Any], names: tuple[str, ...] | None = None,
        *, depth: int = 1, max_bytes: int | None = None,
    ) -> None:
        self.stage, self.keys, self.device = stage, keys, device
        self.check, self.names, self.depth = check, names, depth
        self.max_bytes = max_bytes
        self.out: list[Row] = [None] * len(keys)
        self.sent = 0
        """How many keys (from the first) were prepared and sent (or failed to prepare)."""
        self._queued: list[tuple[list[int], list[Any]]] = []  # batches sent, oldest first
        self._retry: list[tuple[int, Any]] = []

    def send(self, enough: Callable[[], bool] | None = None,
             before: Callable[[int], None] | None = None) -> None:
        """Prepare and send every key, or, with ``enough``, stop preparing once it returns
        true (checked as answers come; :attr:`sent` says how many were). ``before(i)`` runs
        just before key ``i`` is prepared (to take its source's identity before it is
        read)."""
        stage = self.stage
        rows: list[int] = []
        items: list[Any] = []
        for i in range(self.sent, len(self.keys)):
            if enough is not None and enough():
                break
            self.sent = i + 1
            if before is not None:
                before(i)
            key = self.keys[i]
            try:
                items.append(key if stage.prepare is None else stage.prepare(key))
            except Exception as exc:
                self.out[i] = Failure(f"{type(exc).__name__}: {exc}", loader_frames(exc))
                continue
            rows.append(i)
            if len(rows) == stage.batch_size:
                self._send(rows, items)
                rows, items = [], []
        if rows:
            self._send(rows, items)

    def take(self) -> bool:
        """Take the oldest answer due (waiting for it); False if none is due."""
        if not self._queued:
            return False
        self._finish(*self._queued.pop(0))
        return True

    def finish(self) -> list[Row]:
        """Take every answer still due, send the keys of failed batches again one by one;
        the rows of the keys sent."""
        while self.take():
            pass
        for i, item in self._retry:  # key by key, so that each failure is named
            self.stage.send(self.device, [item])
            self._finish([i], [item])
        self._retry.clear()
        return self.out[: self.sent]

    def _send(self, rows: list[int], items: list[Any]) -> None:
        if self.max_bytes is not None:  # the first batch tells what a batch weighs
            per_batch = max(1, sum(_nbytes(item) for item in items))
            self.depth = max(0, min(self.depth, self.max_bytes // per_batch - 1))
            self.max_bytes = None
        self.stage.send(self.device, items)
        self._queued.append((rows, items))
        while self._queued and (len(self._queued) > self.depth + 1
                                or self.stage.ready(self.device)):
            self._finish(*self._queued.pop(0))

    def _finish(self, rows: list[int], items: list[Any]) -> None:
        kind, result, frames = self.stage.receive(self.device)
        if kind != "ok":
            if len(rows) == 1:
                self.out[rows[0]] = Failure(result, frames)
            else:
                self._retry.extend(zip(rows, items, strict=True))
            return
        values = _rows(result, len(rows), self.keys[rows[0]], self.names)
        for i, value in zip(rows, values, strict=True):
            try:
                self.out[i] = self.check(self.keys[i], value)
            except Exception as exc:
                self.out[i] = Failure(f"{type(exc).__name__}: {exc}", "")


def _nbytes(item: Any, depth: int = 0) -> int:
    """About how many bytes a prepared item holds: an array's (NumPy, torch), an image's
    pixels (PIL), the sum of a dict's, list's or tuple's items, else the object's size."""
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if depth < 4 and isinstance(item, (dict, list, tuple)):
        values = item.values() if isinstance(item, dict) else item
        return sys.getsizeof(item) + sum(_nbytes(v, depth + 1) for v in values)
    bands = getattr(item, "getbands", None)
    if callable(bands) and isinstance(getattr(item, "width", None), int):
        return int(item.width) * int(item.height) * len(bands())
    return sys.getsizeof(item)


def compute_rows(
    stage: DeviceStage,
    keys: list[str],
    device: int,
    check: Callable[[str, Any], Any],
    names: tuple[str, ...] | None = None,
) -> list[Row]:
    """The rows of ``keys``, in key order, computed on device worker ``device`` (see
    :class:`BatchRun`)."""
    run = BatchRun(stage, keys, device, check, names)
    run.send()
    return run.finish()
