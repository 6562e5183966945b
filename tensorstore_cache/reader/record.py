"""A record of a store: its fields' values by name, read-only.

``store[key]`` of a store of records is a :class:`Record`: a read-only
``dict`` (so a :class:`~collections.abc.Mapping`) from field name to value,
each value also an attribute (``rec.image is rec["image"]``). Fixed and ragged
values are copy-on-write views of the mapped files (a scalar field is a 0-d
view), text values are ``str``; nothing is copied. Reading a field is a
``dict`` lookup, in C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

__all__ = ["Record"]

_READ_ONLY = "a record is read-only (its values are views of the store's files)"


class Record(dict[str, Any]):
    """The fields of one key, read-only: ``rec["image"]``, ``rec.image``, ``dict(rec)``.

    Made as a ``dict`` is, from each field's value by name, in schema order.

    Examples
    --------
    >>> rec = Record({"image": np.zeros((3, 2, 2), np.uint8), "title": "Dune"})
    >>> rec.title, rec["image"].shape, list(rec)
    ('Dune', (3, 2, 2), ['image', 'title'])
    >>> rec.image is rec["image"]
    True
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"this record has no field {name!r}; its fields are {list(self)}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(_READ_ONLY)

    def __setitem__(self, name: str, value: Any) -> NoReturn:
        raise TypeError(_READ_ONLY)

    def __delitem__(self, name: str) -> NoReturn:
        raise TypeError(_READ_ONLY)

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        raise TypeError(_READ_ONLY)

    def clear(self) -> NoReturn:
        """Refused: a record is read-only (``TypeError``)."""
        raise TypeError(_READ_ONLY)

    def pop(self, *args: Any) -> NoReturn:
        """Refused: a record is read-only (``TypeError``).

        Parameters
        ----------
        *args
            What ``dict.pop`` takes.
        """
        raise TypeError(_READ_ONLY)

    def popitem(self) -> NoReturn:
        """Refused: a record is read-only (``TypeError``)."""
        raise TypeError(_READ_ONLY)

    def setdefault(self, *args: Any) -> NoReturn:
        """Refused: a record is read-only (``TypeError``).

        Parameters
        ----------
        *args
            What ``dict.setdefault`` takes.
        """
        raise TypeError(_READ_ONLY)

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: a record is read-only (``TypeError``).

        Parameters
        ----------
        *args, **kwargs
            What ``dict.update`` takes.
        """
        raise TypeError(_READ_ONLY)

    def __reduce__(self) -> tuple[type[Record], tuple[dict[str, Any]]]:
        return Record, (dict(self),)

    def __copy__(self) -> dict[str, Any]:
        # a plain dict of the same views, as rec.copy(): what a caller copies to change it
        # (torch's default_collate copies a mapping, then updates the copy)
        return dict(self)

    def __repr__(self) -> str:
        def show(v: Any) -> str:
            if isinstance(v, np.ndarray):
                return f"array({v.shape}, {v.dtype})" if v.ndim else repr(v.item())
            return repr(v)

        return "Record(" + ", ".join(f"{k}={show(v)}" for k, v in self.items()) + ")"

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self})


class _FieldFirst:
    """A ``dict`` method of :class:`Record` that a field may be named after (``copy``,
    ``update``...): ``rec.<name>`` is the field when the record has one, as for every other
    field, else the method."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.__doc__ = getattr(method, "__doc__", None)
        self.name: str = getattr(method, "__name__", "")

    def __get__(self, record: Record | None, owner: type | None = None) -> Any:
        if record is not None and self.name in record:
            return dict.__getitem__(record, self.name)
        get: Callable[..., Any] = self.method.__get__
        return get(record, owner) if record is not None else get(None, owner)


#: The methods of ``dict`` whose names a field may have (get, items, keys and values are
#: names a field may not take).
_SHADOWED = ("clear", "copy", "fromkeys", "pop", "popitem", "setdefault", "update")
for _name in _SHADOWED:
    setattr(Record, _name, _FieldFirst(Record.__dict__.get(_name, dict.__dict__[_name])))
