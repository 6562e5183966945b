"""A batch's result: made NumPy in the device worker, split into rows in the CPU worker.

A result must have one row per item: an array whose leading dimension is
the batch's length, or a dict of field name -> such an array (a list of
arrays, or a :class:`~tensorstore_cache.Ragged` batch, for a ragged field; a
list of ``str`` for a text field). Anything else fails the build, naming
the batch's first key.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import BuildError
from ...format import Ragged

__all__ = ["as_numpy", "batch_rows", "prepared_nbytes"]


def as_numpy(value: Any) -> Any:
    """A batch's result with tensors of any framework as NumPy arrays (a dict: each field)."""
    if isinstance(value, dict):
        return {name: as_numpy(v) for name, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [as_numpy(v) for v in value]
        return items if type(value) is list else tuple(items)  # namedtuples too
    detach = getattr(value, "detach", None)
    if callable(detach):  # a torch tensor, possibly on a GPU: bring it home
        return detach().cpu().numpy()
    return value


def batch_rows(result: Any, n: int, first: str, names: tuple[str, ...] | None) -> list[Any]:
    """Split a batch's result into its ``n`` rows (a record: a dict per row).

    Parameters
    ----------
    result
        What the batch loader returned for the batch.
    n
        The batch's items.
    first
        The batch's first key (named by the error).
    names
        The field names of a loader's tuples, in order.

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


def prepared_nbytes(item: Any, depth: int = 0) -> int:
    """About how many bytes a prepared item holds: an array's (NumPy, torch), an image's
    pixels (PIL), the sum of a dict's, list's or tuple's items, else the object's size."""
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if depth < 4 and isinstance(item, (dict, list, tuple)):
        values = item.values() if isinstance(item, dict) else item
        return sys.getsizeof(item) + sum(prepared_nbytes(v, depth + 1) for v in values)
    bands = getattr(item, "getbands", None)
    if callable(bands) and isinstance(getattr(item, "width", None), int):
        return int(item.width) * int(item.height) * len(bands())
    return sys.getsizeof(item)
