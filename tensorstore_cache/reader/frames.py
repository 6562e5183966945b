"""pandas: a store's values as a Series aligned to a column of paths, or its records as a
DataFrame. pandas is imported only here, when first used."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..format import Fixed, path_sequence
from .gather import take_field
from .lookup import find_rows
from .view import StoreView

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["frame", "series"]


def _views(view: StoreView, unique: Any) -> Any:
    """One value (a view of the mapped files, or a Record) per row of ``unique``."""
    values = np.empty(len(unique), dtype=object)
    for i, row in enumerate(unique.tolist()):
        values[i] = view.vector(row)
    return values


def series(view: StoreView, paths: Iterable[Any], name: Hashable | None) -> pd.Series[Any]:
    """The value of every path as a Series aligned to ``paths`` (see ``CacheStore.series``).

    Parameters
    ----------
    view
        The store.
    paths
        A Series of paths (its index is kept), or any iterable of paths.
    name
        Name of the returned Series.
    """
    import pandas as pd

    index: pd.Index[Any] | None = paths.index if isinstance(paths, pd.Series) else None
    view.check_open()
    rows = find_rows(view.overlay, paths, "raise")
    unique, inverse = np.unique(rows, return_inverse=True)
    values = _views(view, unique)[inverse.reshape(-1)]  # one view per distinct path
    return pd.Series(values, index=index, name=name, dtype=object, copy=False)


def frame(view: StoreView, paths: Iterable[Any], fields: Sequence[str] | None) -> pd.DataFrame:
    """The records of ``paths``, one column per field (see ``CacheStore.frame``).

    Parameters
    ----------
    view
        A store of records.
    paths
        Paths of the store, any order, repeats allowed.
    fields
        The columns (None: every field, in schema order).
    """
    import pandas as pd

    if not view.records or view.field is not None:
        raise TypeError("frame() is a DataFrame of a store of records; use series() here")
    names = list(view.layouts) if fields is None else list(fields)
    for name in names:
        if name not in view.layouts:
            raise KeyError(f"no field {name!r}; the fields are {list(view.layouts)}")
    keys = path_sequence(paths)
    view.check_open()
    rows = find_rows(view.overlay, keys, "raise")
    unique, inverse = np.unique(rows, return_inverse=True)
    inverse = inverse.reshape(-1)
    columns: dict[str, Any] = {}
    for name in names:
        f = view.layouts[name].field
        if isinstance(f, Fixed) and f.shape == ():
            columns[name] = take_field(view, name, rows)
        else:
            columns[name] = _views(view.of_field(name), unique)[inverse]
    index = pd.Index([str(k) for k in keys], name="path")
    return pd.DataFrame(columns, index=index, copy=False)
