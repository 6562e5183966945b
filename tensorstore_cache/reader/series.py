"""pandas integration: a column of vectors aligned to a column of paths.

Imported only by :meth:`CacheStore.series`, so that ``import tensorstore_cache``
never imports pandas.

The column is an ``object`` Series whose every element is a ``(C, H, W)``
NumPy view of the mapped files: what the seed's ``img_vector`` column held
(one array per row), without copying a byte. A pandas extension type for
tensors (e.g. pyarrow's fixed-shape tensor) would copy every vector into
Arrow memory, private to each process; the views stay in the OS page cache,
shared by every process that opens the store.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from .store import CacheStore

__all__ = ["series"]


def series(
    store: CacheStore, paths: Iterable[str | os.PathLike[str]], *, name: Hashable | None = None
) -> pd.Series[Any]:
    """Return the vectors of ``paths`` as a Series aligned to them.

    See :meth:`CacheStore.series`.
    """
    index: pd.Index[Any] | None = paths.index if isinstance(paths, pd.Series) else None
    rows = store.rows(paths)
    unique, inverse = np.unique(rows, return_inverse=True)
    views = np.empty(len(unique), dtype=object)
    for i, row in enumerate(unique.tolist()):  # one view per distinct path
        views[i] = store._vector(row)
    values = views[inverse.reshape(-1)]
    return pd.Series(values, index=index, name=name, dtype=object, copy=False)
