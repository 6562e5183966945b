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

import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BuildError
from ..format import Ragged
from .devices import TRACE_FRAMES, DeviceStage

__all__ = ["Failure", "Row", "compute_rows"]


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


def compute_rows(
    stage: DeviceStage,
    keys: list[str],
    device: int,
    check: Callable[[str, Any], Any],
    names: tuple[str, ...] | None = None,
    *,
    enough: Callable[[], bool] | None = None,
    depth: int = 1,
) -> list[Row]:
    """The rows of ``keys``, in key order: each its value, checked by ``check(key, value)``,
    or a :class:`Failure` (of ``prepare``, of the loader on the key alone, or of ``check``).

    Batches go to device worker ``device``; up to ``depth`` stay queued behind
    the one computing, and every answer is taken as soon as it is there.
    ``names`` orders the fields of a loader's tuples. With ``enough``, no
    further key is prepared once it returns true (checked as answers come):
    the rows of the keys prepared until then are returned, a prefix of ``keys``.
    """
    out: list[Row] = [None] * len(keys)
    queued: list[tuple[list[int], list[Any]]] = []  # batches sent, oldest first
    retry: list[tuple[int, Any]] = []

    def finish(rows: list[int], items: list[Any]) -> None:
        kind, result, frames = stage.receive(device)
        if kind != "ok":
            if len(rows) == 1:
                out[rows[0]] = Failure(result, frames)
            else:
                retry.extend(zip(rows, items, strict=True))
            return
        values = _rows(result, len(rows), keys[rows[0]], names)
        for i, value in zip(rows, values, strict=True):
            try:
                out[i] = check(keys[i], value)
            except Exception as exc:
                out[i] = Failure(f"{type(exc).__name__}: {exc}", "")

    def send(rows: list[int], items: list[Any]) -> None:
        stage.send(device, items)
        queued.append((rows, items))
        while queued and (len(queued) > depth + 1 or stage.ready(device)):
            finish(*queued.pop(0))

    rows: list[int] = []
    items: list[Any] = []
    done = len(keys)
    for i, key in enumerate(keys):
        if enough is not None and enough():
            done = i
            break
        try:
            items.append(key if stage.prepare is None else stage.prepare(key))
        except Exception as exc:
            out[i] = Failure(f"{type(exc).__name__}: {exc}", _frames(exc))
            continue
        rows.append(i)
        if len(rows) == stage.batch_size:
            send(rows, items)
            rows, items = [], []
    if rows:
        send(rows, items)
    while queued:
        finish(*queued.pop(0))
    for i, item in retry:  # key by key, so that each failure is named
        stage.send(device, [item])
        finish([i], [item])
    return out[:done]


def _frames(exc: BaseException) -> str:
    """The last frames of ``exc``'s traceback that are not this module's, formatted."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    return "".join(traceback.format_list(frames[-TRACE_FRAMES:])).rstrip()
