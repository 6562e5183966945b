"""Fields of a store: their kinds (:class:`Fixed`, :class:`Ragged`, :class:`Text`) and layout.

A store of format 1 holds one fixed-shape tensor per key: the ``vectors``
array. A store of format 2 holds a *record* per key: named fields, each one of
three kinds.

:class:`Fixed`
    one array, ``fields/<name>``, sharded like ``vectors``: values of one shape
    and dtype (a scalar has shape ``()``).
:class:`Ragged`
    a shape with ``None`` where a dimension varies (``(None,)`` token ids,
    ``(None, 4)`` boxes, ``(3, None, None)`` images of varying size). Stored as
    ``fields/<name>/values`` (every row's values, concatenated in row order;
    regular chunks, ``bytes`` codec) and ``fields/<name>/offsets`` (``uint64``,
    ``n + 1``: row ``i`` is ``values[offsets[i]:offsets[i+1]]``, the layout of
    the key index's ``key_offsets``). When only the first dimension varies,
    ``values`` keeps the other dimensions (``(total, 4)`` for boxes) and offsets
    count its rows; when any other dimension varies, ``values`` is flat,
    offsets count elements, and ``fields/<name>/shapes`` (``int32``, ``(n,
    k)``) holds the ``k`` varying sizes of every row.
:class:`Text`
    strings, stored as a ragged ``uint8`` field of their UTF-8 bytes.

Everything is numeric, so stock zarr-python and Google TensorStore read every
array. A :class:`Ragged` also carries the values of a batch of rows
(``store.take``): ``values``, ``offsets``, ``lengths``, ``pad``.
"""

from __future__ import annotations

import math
import mmap
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "FIELDS",
    "Field",
    "FieldLayout",
    "Fixed",
    "Ragged",
    "Text",
    "check_name",
    "chunk_rows",
    "schema_from_json",
    "schema_to_json",
]

#: Directory of the field arrays of a record store.
FIELDS = "fields"
#: Element types a field may hold.
DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
#: Bytes of one element of every allowed dtype (looked up, not asked of NumPy each time).
_ITEMSIZE: dict[str, int] = {name: np.dtype(name).itemsize for name in DTYPES}
_NAME = re.compile(r"[a-z_][a-z0-9_]*")
#: Names a field may not take: the store's own arrays and a record's (Mapping) methods.
_RESERVED = frozenset(["vectors", "get", "items", "keys", "values"])
_MAX_DIMS = 8
_MAX_SIZE = 1 << 31
MAX_FIELDS = 256


def check_name(name: object, taken: Sequence[str] = ()) -> str:
    """Return ``name`` if it may name a field among ``taken``, else raise ``ValueError``.

    Examples
    --------
    >>> check_name("title_ids")
    'title_ids'
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 64:
        raise ValueError(
            f"field name {name!r} is not allowed: use lowercase letters, digits and '_', "
            "starting with a letter or '_' (at most 64 characters)"
        )
    if name in _RESERVED or name.startswith(("key_", "source_")):
        raise ValueError(
            f"field name {name!r} is reserved (vectors, key_*, source_*, get, items, keys, "
            "values); choose another name"
        )
    clash = [t for t in taken if name in (f"{t}_len", f"{t}_offsets") or t in (
        f"{name}_len", f"{name}_offsets")]
    if name in taken or clash:
        raise ValueError(
            f"field name {name!r} clashes with field {(clash or [name])[0]!r} (a ragged field "
            "f reserves f_len and f_offsets for its lengths in a batch); rename one of them"
        )
    return name


def _fits(value: Any, dtype: np.dtype[Any]) -> bool:
    """Whether ``value`` converts to ``dtype`` unchanged."""
    if type(value) in (int, float, bool) and value == 0:  # the usual pad: fits every dtype
        return True
    try:
        np.array(value, dtype=dtype) if np.ndim(value) == 0 else None  # out of range: raises
        return bool(np.all(np.array(value).astype(dtype) == np.array(value)))
    except (OverflowError, ValueError, TypeError):
        return False


def _dtype_name(value: object) -> str:
    if type(value) is str and value in DTYPES:  # already a name: every one is its own name
        return value
    try:
        name = str(np.dtype(value).name)  # type: ignore[call-overload]
    except TypeError:
        name = ""
    if name not in DTYPES:
        raise ValueError(f"dtype {value!r} is not allowed in a field; use one of {sorted(DTYPES)}")
    return name


@dataclass(frozen=True, slots=True)
class Fixed:
    """A field whose every value has one shape and dtype.

    Examples
    --------
    >>> Fixed((3, 32, 32), "uint8")
    Fixed(shape=(3, 32, 32), dtype='uint8')
    >>> Fixed((), "float32").nbytes   # a scalar
    4
    """

    shape: tuple[int, ...]
    """Shape of one value (``()`` for a scalar)."""
    dtype: str = "float32"
    """NumPy name of the element type."""

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if len(shape) > _MAX_DIMS or not all(type(d) is int and 1 <= d <= _MAX_SIZE for d in shape):
            raise ValueError(
                f"Fixed shape {self.shape!r} must be a tuple of at most {_MAX_DIMS} positive "
                "sizes (use Ragged for sizes that vary)"
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))

    @property
    def kind(self) -> Literal["fixed"]:
        """``"fixed"``."""
        return "fixed"

    @property
    def nbytes(self) -> int:
        """Bytes of one value."""
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]

    @property
    def inner(self) -> tuple[int, ...]:
        """Shape of one row of the field's array: the value's shape."""
        return self.shape


@dataclass(frozen=True, slots=True)
class Ragged:
    """A field whose values vary in size along the dimensions given as ``None``.

    Declared in a schema, it has no data: ``Ragged("int32")`` (token ids of any
    length), ``Ragged("float32", shape=(None, 4))`` (any number of boxes),
    ``Ragged("uint8", shape=(3, None, None))`` (images of any size). Returned
    by ``store.take`` (or by a batched loader), it holds the rows of a batch:
    ``values`` (all rows, concatenated along the first varying dimension, or
    flat when another dimension varies), ``offsets`` (``int64``, ``B + 1``,
    from 0; row ``i`` is ``values[offsets[i]:offsets[i+1]]``) and, when more
    than the first dimension varies, ``shapes`` (``(B, k)``).

    Examples
    --------
    >>> Ragged("int32")
    Ragged(dtype='int32', shape=(None,))
    >>> b = Ragged.from_rows([np.array([1, 2, 3]), np.array([4])], "int64")
    >>> len(b), b.lengths.tolist(), b[1].tolist()
    (2, [3, 1], [4])
    >>> b.pad(value=-1).tolist()
    [[1, 2, 3], [4, -1, -1]]
    """

    dtype: str = "float32"
    """NumPy name of the element type."""
    shape: tuple[int | None, ...] = (None,)
    """Shape of a value, ``None`` where it varies (at least one dimension varies)."""
    values: npt.NDArray[Any] | None = field(default=None, compare=False, repr=False)
    """A batch's values (None: a declaration)."""
    offsets: npt.NDArray[np.int64] | None = field(default=None, compare=False, repr=False)
    """A batch's row offsets into ``values`` (``B + 1``, from 0)."""
    shapes: npt.NDArray[np.int64] | None = field(default=None, compare=False, repr=False)
    """A batch's varying sizes of every row (``(B, k)``), when more than the first dimension
    varies."""

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if (
            not 1 <= len(shape) <= _MAX_DIMS
            or not all(d is None or (type(d) is int and 1 <= d <= _MAX_SIZE) for d in shape)
            or None not in shape
        ):
            raise ValueError(
                f"Ragged shape {self.shape!r} must be a tuple of 1 to {_MAX_DIMS} sizes with "
                "None where a dimension varies (at least one; use Fixed otherwise)"
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))

    @property
    def kind(self) -> Literal["ragged"]:
        """``"ragged"``."""
        return "ragged"

    @property
    def varying(self) -> tuple[int, ...]:
        """The dimensions that vary."""
        return tuple(i for i, d in enumerate(self.shape) if d is None)

    @property
    def flat(self) -> bool:
        """Whether values are stored flat, each row's varying sizes apart (``shapes``)."""
        return self.varying != (0,)

    @property
    def inner(self) -> tuple[int, ...]:
        """Shape of one element of ``values`` along its first axis (``()`` when flat)."""
        return () if self.flat else tuple(d for d in self.shape[1:] if d is not None)

    def declaration(self) -> Ragged:
        """This field without data."""
        return Ragged(self.dtype, self.shape)

    # -- a batch ------------------------------------------------------------------------

    @classmethod
    def from_rows(
        cls, rows: Sequence[npt.ArrayLike], dtype: str | None = None,
        shape: tuple[int | None, ...] | None = None,
    ) -> Ragged:
        """A batch of the arrays ``rows``.

        Parameters
        ----------
        rows
            One array (or array-like) per row.
        dtype
            The values' type (default: the first row's).
        shape
            The template of a row's shape, None for a varying dimension (default: only the
            first dimension varies).
        """
        arrays = [np.asarray(r) if dtype is None else np.asarray(r, dtype=dtype) for r in rows]
        kind = dtype or (arrays[0].dtype.name if arrays else "float32")
        if shape is None:
            ndim = arrays[0].ndim if arrays else 1
            shape = (None, *(arrays[0].shape[1:] if arrays else ()))[:max(ndim, 1)]
        template = Ragged(kind, shape)
        return template.batch(arrays)

    def batch(self, rows: Sequence[npt.NDArray[Any]]) -> Ragged:
        """This field's batch of ``rows`` (checked against the declared shape).

        Parameters
        ----------
        rows
            One array per row, each of the field's shape (its varying dimensions any size).
        """
        varying = self.varying
        lengths = np.empty(len(rows), np.int64)
        shapes = np.empty((len(rows), len(varying)), np.int64)
        for i, row in enumerate(rows):
            if row.ndim != len(self.shape) or any(
                d is not None and d != s for d, s in zip(self.shape, row.shape, strict=True)
            ):
                raise ValueError(f"row {i} has shape {row.shape}, not {self.shape}")
            shapes[i] = [row.shape[d] for d in varying]
            lengths[i] = row.size if self.flat else row.shape[0]
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        parts = [np.asarray(r, self.dtype).reshape(-1 if self.flat else (-1, *self.inner))
                 for r in rows]
        empty = np.empty((0, *self.inner), self.dtype)
        values = np.concatenate(parts) if parts else empty
        return Ragged(self.dtype, self.shape, values=values, offsets=offsets,
                      shapes=shapes if self.flat else None)

    def of_arrays(
        self, values: npt.NDArray[Any], offsets: npt.NDArray[np.int64],
        shapes: npt.NDArray[np.int64] | None = None,
    ) -> Ragged:
        """This field's batch of arrays already laid out and checked (what a store's reader
        returns): no per-row check, no copy.

        Parameters
        ----------
        values
            Every row's values, concatenated along the first dimension.
        offsets
            ``B + 1`` offsets from 0 into ``values``: row ``i`` is
            ``values[offsets[i]:offsets[i + 1]]``.
        shapes
            For a field with more than one varying dimension: each row's sizes
            along them, ``(B, varying)`` (None otherwise).

        Examples
        --------
        >>> b = Ragged("int32").of_arrays(np.arange(5, dtype=np.int32), np.array([0, 2, 5]))
        >>> b.lengths.tolist(), b[1].tolist()
        ([2, 3], [2, 3, 4])
        """
        if len(offsets) == 0 or int(offsets[0]) != 0:
            raise ValueError("a batch's offsets start at 0 and hold one more entry than rows")
        batch = object.__new__(Ragged)
        for name, value in (("dtype", self.dtype), ("shape", self.shape), ("values", values),
                            ("offsets", offsets), ("shapes", shapes)):
            object.__setattr__(batch, name, value)
        return batch

    def _data(self) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
        if self.values is None or self.offsets is None:
            raise TypeError(f"{self!r} is a field declaration, not a batch of rows")
        return self.values, self.offsets

    def __len__(self) -> int:
        _values, offsets = self._data()
        return len(offsets) - 1

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Every row's size along its first varying dimension."""
        _values, offsets = self._data()
        if self.shapes is not None:
            return np.asarray(self.shapes[:, 0], np.int64)
        return np.diff(offsets)

    def row_shape(self, i: int) -> tuple[int, ...]:
        """The shape of row ``i``.

        Parameters
        ----------
        i
            A row of the batch.
        """
        if self.shapes is None:
            _values, offsets = self._data()
            return (int(offsets[i + 1] - offsets[i]), *self.inner)
        sizes = iter(self.shapes[i].tolist())
        return tuple(next(sizes) if d is None else d for d in self.shape)

    def __getitem__(self, i: int) -> npt.NDArray[Any]:
        """Row ``i``: a view of ``values``."""
        values, offsets = self._data()
        n = len(offsets) - 1
        if not -n <= i < n:
            raise IndexError(f"row {i} of a batch of {n}")
        i %= n
        view = values[int(offsets[i]) : int(offsets[i + 1])]
        return view.reshape(self.row_shape(i)) if self.flat else view

    def __iter__(self) -> Iterator[npt.NDArray[Any]]:
        return (self[i] for i in range(len(self)))

    def pad(self, value: Any = 0, max_len: int | None = None) -> npt.NDArray[Any]:
        """Rows padded to the batch's largest size in every varying dimension: ``(B, *shape)``.

        Parameters
        ----------
        value
            What the padding holds (it must fit the field's dtype).
        max_len
            Caps the first varying dimension (longer rows are truncated); None: no cap.
        """
        values, offsets = self._data()
        b = len(offsets) - 1
        if not _fits(value, values.dtype):
            raise ValueError(f"the pad value {value!r} does not fit this field's {values.dtype}; "
                             "pass a value of that type")
        if self.shapes is None:  # only the first dimension varies: one vectorised scatter
            lengths = offsets[1:] - offsets[:-1]
            longest = int(lengths.max()) if b else 0
            width = longest if max_len is None else min(longest, int(max_len))
            out = np.full((b, width, *values.shape[1:]), value, dtype=values.dtype)
            if width == longest:  # nothing truncated: every value to its place, one scatter
                total = int(offsets[-1])  # (cheaper than a mask of every padded place)
                if total:
                    to = np.repeat(np.arange(0, b * width, width) - offsets[:-1], lengths)
                    to += np.arange(total)
                    out.reshape(b * width, *values.shape[1:])[to] = values[:total]
                return out
            keep = np.minimum(lengths, width)
            rows = np.repeat(np.arange(b), keep)
            within = np.arange(int(keep.sum())) - np.repeat(np.cumsum(keep) - keep, keep)
            source = np.repeat(offsets[:-1], keep) + within
            out[rows, within] = values[source]
            return out
        sizes = self.shapes.max(axis=0, initial=0) if b else np.zeros(len(self.varying), np.int64)
        if max_len is not None and len(sizes):
            sizes[0] = min(int(sizes[0]), int(max_len))
        it = iter(sizes.tolist())
        full: tuple[int, ...] = tuple(int(next(it)) if d is None else d for d in self.shape)
        out = np.full((b, *full), value, dtype=values.dtype)
        for i in range(b):
            row = self[i]
            cut = tuple(slice(0, min(s, t)) for s, t in zip(row.shape, full, strict=True))
            out[i][cut] = row[cut]
        return out


@dataclass(frozen=True, slots=True)
class Text:
    """A field of strings, stored as a ragged ``uint8`` field of their UTF-8 bytes.

    Examples
    --------
    >>> Text().dtype
    'uint8'
    """

    @property
    def kind(self) -> Literal["text"]:
        """``"text"``."""
        return "text"

    @property
    def dtype(self) -> str:
        """``"uint8"``: the bytes of the UTF-8 text."""
        return "uint8"

    @property
    def shape(self) -> tuple[int | None, ...]:
        """``(None,)``."""
        return (None,)

    @property
    def flat(self) -> bool:
        """False: offsets count bytes."""
        return False

    @property
    def inner(self) -> tuple[int, ...]:
        """``()``."""
        return ()


Field = Fixed | Ragged | Text
"""The kind, dtype and shape of one field."""


@dataclass(frozen=True, slots=True)
class FieldLayout:
    """One field of a store as it lies on disk.

    ``rows_per_shard`` is the shard length of a fixed field; ``chunk`` the
    chunk length (first axis) of a ragged or text field's ``values`` and
    ``total`` that array's length.
    """

    name: str
    """The field's name (``vectors`` for the one array of format 1)."""
    field: Field
    """What it holds."""
    n: int
    """Rows of the store."""
    rows_per_shard: int = 1
    """Fixed: rows per shard file."""
    chunk: int = 1
    """Ragged and text: rows of ``values`` per chunk file."""
    total: int = 0
    """Ragged and text: rows of ``values``."""
    path: str = ""
    """The field's array (fixed) or group (ragged, text) in the store."""

    @property
    def kind(self) -> Literal["fixed", "ragged", "text"]:
        """``"fixed"``, ``"ragged"`` or ``"text"``."""
        return self.field.kind

    @property
    def dtype(self) -> str:
        """Element type."""
        return self.field.dtype

    @property
    def values_shape(self) -> tuple[int, ...]:
        """Shape of the ``values`` array (ragged, text)."""
        assert not isinstance(self.field, Fixed)
        return (self.total, *self.field.inner)

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row of the field's array (fixed) or of ``values`` (ragged, text)."""
        return math.prod(self.field.inner) * _ITEMSIZE[self.dtype]

    def shard_count(self) -> int:
        """Shard files (fixed) or ``values`` chunk files (ragged, text)."""
        if isinstance(self.field, Fixed):
            return -(-self.n // self.rows_per_shard)
        return -(-self.total // self.chunk)

    def chunk_key(self, k: int) -> str:
        """The store-relative path of shard ``k`` (fixed) or ``values`` chunk ``k``."""
        prefix, suffix = self._chunk_parts()
        return f"{prefix}{k}{suffix}"

    def chunk_keys(self) -> list[str]:
        """The store-relative path of every shard (fixed) or ``values`` chunk, in order."""
        prefix, suffix = self._chunk_parts()
        return [f"{prefix}{k}{suffix}" for k in range(self.shard_count())]

    def _chunk_parts(self) -> tuple[str, str]:
        """What comes before and after the number ``k`` in :meth:`chunk_key`."""
        array = self.path if isinstance(self.field, Fixed) else f"{self.path}/values"
        dims = len(self.field.shape if isinstance(self.field, Fixed) else self.field.inner)
        return f"{array}/c/".lstrip("/"), "/0" * dims

    def to_json(self) -> dict[str, Any]:
        """The field's entry in the group attributes of a format-2 store."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if isinstance(self.field, Fixed):
            out.update(dtype=self.dtype, shape=list(self.field.shape),
                       rows_per_shard=self.rows_per_shard)
        else:
            if isinstance(self.field, Ragged):
                out.update(dtype=self.dtype, shape=list(self.field.shape))
            out.update(chunk=self.chunk, total=self.total)
        return out


def chunk_rows(total: int, row_nbytes: int, target_bytes: int) -> int:
    """Rows of ``values`` per chunk: about ``target_bytes``, no more than ``total`` needs,
    a multiple of the rows that fill whole pages (so chunks lie side by side in memory).

    Examples
    --------
    >>> chunk_rows(1000, 4, 8 << 20)   # 4,000 bytes fit one page: 1,024 rows
    1024
    """
    unit = mmap.PAGESIZE // math.gcd(max(row_nbytes, 1), mmap.PAGESIZE)
    rows = max(1, min(max(target_bytes // max(row_nbytes, 1), 1), max(total, 1)))
    return -(-rows // unit) * unit


def schema_to_json(schema: Sequence[tuple[str, Field]]) -> list[dict[str, Any]]:
    """A schema (names and fields, no layout) as JSON values: what a fingerprint records."""
    out = []
    for name, f in schema:
        entry: dict[str, Any] = {"name": name, "kind": f.kind}
        if not isinstance(f, Text):
            entry.update(dtype=f.dtype, shape=list(f.shape))
        out.append(entry)
    return out


def schema_from_json(value: Any) -> tuple[tuple[str, Field], ...]:
    """Parse a schema (or a store's field list, whose layout keys are ignored).

    Raises
    ------
    ValueError
        If it is not a valid schema.
    """
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_FIELDS:
        raise ValueError(f"fields must be a list of 1 to {MAX_FIELDS} fields")
    out: list[tuple[str, Field]] = []
    for entry in value:
        if not isinstance(entry, dict):
            raise ValueError(f"a field must be an object, got {entry!r}")
        name = check_name(entry.get("name"), [n for n, _f in out])
        kind = entry.get("kind")
        shape = entry.get("shape")
        f: Field
        if kind == "text":
            f = Text()
        elif kind in ("fixed", "ragged"):
            if not isinstance(shape, list) or len(shape) > _MAX_DIMS:
                raise ValueError(f"field {name!r}: shape must be a list, got {shape!r}")
            if kind == "fixed":
                f = Fixed(tuple(shape), entry.get("dtype", ""))
            else:
                f = Ragged(entry.get("dtype", ""), tuple(shape))
        else:
            raise ValueError(f"field {name!r}: kind must be fixed, ragged or text, got {kind!r}")
        out.append((name, f))
    return tuple(out)
