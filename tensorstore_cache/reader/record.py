"""A record of a store: its fields' values by name, read-only.

``store[key]`` of a store of records is a :class:`Record`: a
:class:`~collections.abc.Mapping` from field name to value, each value also
an attribute (``rec.image is rec["image"]``). Fixed and ragged values are
copy-on-write views of the mapped files (a scalar field is a 0-d view), text
values are ``str``; nothing is copied.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["Record", "record_of"]


class Record(Mapping[str, Any]):
    """The fields of one key, read-only: ``rec["image"]``, ``rec.image``, ``dict(rec)``.

    Parameters
    ----------
    values
        Each field's value, by name, in schema order (kept, not copied).

    Examples
    --------
    >>> rec = Record({"image": np.zeros((3, 2, 2), np.uint8), "title": "Dune"})
    >>> rec.title, rec["image"].shape, list(rec)
    ('Dune', (3, 2, 2), ['image', 'title'])
    >>> rec.image is rec["image"]
    True
    """

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        _set_values(self, values)  # past __setattr__, which refuses every attribute

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(
                f"this record has no field {name!r}; its fields are {list(self._values)}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a record is read-only (its values are views of the store's files)")

    def __setitem__(self, name: str, value: Any) -> None:
        raise TypeError("a record is read-only (its values are views of the store's files)")

    def __repr__(self) -> str:
        def show(v: Any) -> str:
            if isinstance(v, np.ndarray):
                return f"array({v.shape}, {v.dtype})" if v.ndim else repr(v.item())
            return repr(v)

        return "Record(" + ", ".join(f"{k}={show(v)}" for k, v in self._values.items()) + ")"

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._values})


#: Sets a record's values, past its ``__setattr__`` (which refuses every attribute): the
#: slot's own setter, bound once (the reader makes a record per key it reads).
_set_values = Record._values.__set__  # type: ignore[attr-defined]
_new = object.__new__


def record_of(values: dict[str, Any]) -> Record:
    """``Record(values)`` without a call of ``__init__``: what the reader makes for every key
    it reads."""
    record: Record = _new(Record)
    _set_values(record, values)
    return record
