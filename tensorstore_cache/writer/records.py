"""Records a loader returns: checked against the store's schema, or a schema inferred from one.

A loader of records returns a ``dict`` of field name -> value, or a ``tuple``
in the order of the names given as ``fields=``. Every record is checked
before anything of it is stored, and every error names the key, the field,
what was expected and what came:

* a NumPy value must have the field's dtype exactly (never a silent cast);
* a Python scalar or list converts when its value survives: an ``int`` that
  the field's integer type holds exactly, a ``float`` that is finite in the
  field's float type (rounded to it), a ``bool`` for ``bool``;
* a fixed field's value has its shape; a ragged one has its number of
  dimensions and the declared size of every dimension that does not vary;
* a text field's value is a ``str``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..format import Field, Fixed, Ragged, Text, check_name

__all__ = [
    "Schema", "check_record", "infer_schema", "is_record", "normalize_fields", "record_checker",
]

Schema = tuple[tuple[str, Field], ...]
"""The fields of a record, in order: ``(name, field)``."""


def is_record(value: object) -> bool:
    """Whether a loader's result is a record (a dict or a tuple) rather than one array."""
    return isinstance(value, (Mapping, tuple))


def normalize_fields(
    fields: Mapping[str, Field] | Sequence[str] | None,
) -> tuple[Schema | None, tuple[str, ...] | None]:
    """``fields=`` as ``(declared schema or None, names or None)``.

    A mapping declares the schema; a sequence of names orders the values of a
    loader that returns tuples (their kinds are inferred); None infers
    everything from the first record.

    Raises
    ------
    ValueError
        If a name is not allowed or repeats.
    TypeError
        If a field is not :class:`Fixed`, :class:`Ragged` or :class:`Text`.
    """
    if fields is None:
        return None, None
    if isinstance(fields, Mapping):
        schema: list[tuple[str, Field]] = []
        for name, f in fields.items():
            check_name(name, [n for n, _f in schema])
            if not isinstance(f, (Fixed, Ragged, Text)):
                raise TypeError(
                    f"field {name!r} is declared as {f!r}; declare it as tsc.Fixed(shape, dtype), "
                    "tsc.Ragged(dtype, shape) or tsc.Text()"
                )
            schema.append((name, f.declaration() if isinstance(f, Ragged) else f))
        if not schema:
            raise ValueError("fields= declares no field; declare at least one")
        return tuple(schema), tuple(n for n, _f in schema)
    if isinstance(fields, str) or not isinstance(fields, Sequence):
        raise TypeError(
            f"fields= must be a dict of name -> tsc.Fixed/Ragged/Text or a tuple of names, "
            f"got {fields!r}"
        )
    names: list[str] = []
    for name in fields:
        names.append(check_name(name, names))
    if not names:
        raise ValueError("fields= names no field; name at least one")
    return None, tuple(names)


def _values(key: str, value: object, names: tuple[str, ...] | None) -> dict[str, Any]:
    """A record's values by field name."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        if names is None:
            raise TypeError(
                f"the loader returned a tuple of {len(value)} values for {key!r}, but its fields "
                "have no names; pass fields=(\"image\", \"label\", ...) naming them in order, or "
                "return a dict"
            )
        if len(value) != len(names):
            raise ValueError(
                f"the loader returned {len(value)} values for {key!r}, but fields= names "
                f"{len(names)}: {list(names)}"
            )
        return dict(zip(names, value, strict=True))
    raise TypeError(
        f"the loader returned {type(value).__name__} for {key!r}; a store of records needs a "
        "dict of field values (or a tuple, with fields= naming them)"
    )


def _convert(key: str, name: str, value: object, dtype: str) -> npt.NDArray[Any]:
    """``value`` as an array of ``dtype``: NumPy values exactly, Python values if they survive."""
    want = np.dtype(dtype)
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype != want:
            raise TypeError(
                f"{key!r}: field {name!r} must be {dtype}, the loader returned {value.dtype}; "
                f"convert it (e.g. .astype({dtype!r})) or declare the field as {value.dtype}"
            )
        return np.asarray(value)
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{key!r}: field {name!r} got {value!r}, not an array: {exc}") from None
    if raw.dtype.kind not in "biuf":
        raise TypeError(
            f"{key!r}: field {name!r} must be {dtype}, the loader returned "
            f"{type(value).__name__} holding {raw.dtype}"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        out = raw.astype(want)
    if want.kind == "f":
        ok = bool(np.all(np.isfinite(out) | ~np.isfinite(raw)))
    elif want.kind == "b":
        ok = raw.dtype.kind == "b"
    else:
        ok = raw.dtype.kind in "biu" and bool(np.all(out.astype(raw.dtype) == raw))
    if not ok:
        raise TypeError(
            f"{key!r}: field {name!r} must be {dtype}, and the loader's {type(value).__name__} "
            f"({raw.dtype}) does not fit in it without changing its values"
        )
    return out


def _fits(got: tuple[int, ...], declared: tuple[int | None, ...], fixed: bool) -> bool:
    """Whether a value of shape ``got`` has a field's ``declared`` shape: all of it for a
    fixed field, its number of dimensions and every size that does not vary (None) for a
    ragged one."""
    if fixed:
        return got == declared
    return len(got) == len(declared) and all(
        d is None or d == s for d, s in zip(declared, got, strict=True))


#: A schema's fields as ``(name, dtype, shape, fixed)``, or None where one is text.
_Plan = tuple[tuple[str, np.dtype[Any], tuple[int | None, ...], bool], ...] | None


def _plan(schema: Schema) -> _Plan:
    """What :func:`_as_declared` compares a record with (None: a text field, which needs the
    general check)."""
    if any(isinstance(f, Text) for _n, f in schema):
        return None
    return tuple((n, np.dtype(f.dtype), tuple(f.shape), isinstance(f, Fixed)) for n, f in schema)


def _as_declared(value: object, plan: _Plan) -> dict[str, Any] | None:
    """The values of a dict record whose every value is already an array of its field's
    dtype and shape (what a loader of NumPy values returns), as :func:`check_record` would
    return them; None for any other record, which the general check then takes."""
    if plan is None or type(value) is not dict or len(value) != len(plan):
        return None
    out: dict[str, Any] = {}
    for name, dtype, shape, fixed in plan:
        v = value.get(name)
        if type(v) is not np.ndarray or v.dtype != dtype:
            if not (fixed and not shape and isinstance(v, np.generic) and v.dtype == dtype):
                return None
            v = np.asarray(v)
        elif not _fits(v.shape, shape, fixed):
            return None
        out[name] = v
    return out


def check_record(
    key: str, value: object, schema: Schema, names: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Check a loader's record against ``schema``; return its values, ready to store.

    Fixed and ragged values come back as arrays of the field's dtype, text as
    its UTF-8 bytes (a ``uint8`` array).

    Raises
    ------
    ValueError, TypeError
        Naming the key, the field, what was expected and what came.
    """
    values = _values(key, value, names if names is not None else tuple(n for n, _f in schema))
    wanted = [n for n, _f in schema]
    if set(values) != set(wanted):
        missing = sorted(set(wanted) - set(values))
        extra = sorted(set(values) - set(wanted))
        raise ValueError(
            f"{key!r}: the loader's record has fields {sorted(values)}, the store's are "
            f"{wanted}" + (f"; missing {missing}" if missing else "") +
            (f"; not in the store: {extra}" if extra else "")
        )
    out: dict[str, Any] = {}
    for name, f in schema:
        v = values[name]
        if isinstance(f, Text):
            if not isinstance(v, str):
                raise TypeError(
                    f"{key!r}: field {name!r} is text, the loader returned {type(v).__name__}"
                )
            out[name] = np.frombuffer(v.encode("utf-8"), np.uint8)
            continue
        array = _convert(key, name, v, f.dtype)
        if isinstance(f, Fixed):
            if not _fits(array.shape, f.shape, fixed=True):
                raise ValueError(
                    f"{key!r}: field {name!r} must have shape {f.shape}, the loader returned "
                    f"{array.shape}; if it varies, declare it as tsc.Ragged({f.dtype!r}, "
                    f"shape={tuple(None for _ in array.shape) or (None,)})"
                )
        elif not _fits(array.shape, f.shape, fixed=False):
            raise ValueError(
                f"{key!r}: field {name!r} must have shape {f.shape} (None: any size), the loader "
                f"returned {array.shape}"
            )
        out[name] = array
    return out


def record_checker(
    schema: Schema, names: tuple[str, ...] | None = None
) -> Callable[[str, object], dict[str, Any]]:
    """:func:`check_record` against ``schema``, as ``check(key, value)``, with the common case
    made cheap: a dict whose every value is an array of its field's dtype and shape is taken
    as it is, without the general check's conversions (the same values come back)."""
    plan = _plan(schema)

    def check(key: str, value: object) -> dict[str, Any]:
        fast = _as_declared(value, plan)
        return fast if fast is not None else check_record(key, value, schema, names)

    return check


def infer_schema(key: str, value: object, names: tuple[str, ...] | None) -> Schema:
    """The schema of a first record: arrays and NumPy scalars fixed, ``str`` text.

    Raises
    ------
    TypeError
        For a float64 value (declare it: ``fields=``, or return float32), and a
        value that is no array, scalar or string.
    """
    values = _values(key, value, names)
    schema: list[tuple[str, Field]] = []
    for name, v in values.items():
        check_name(name, [n for n, _f in schema])
        if isinstance(v, str):
            schema.append((name, Text()))
            continue
        try:
            array = np.asarray(v)
        except (TypeError, ValueError):
            array = np.asarray(None)
        if array.dtype.kind not in "biuf":
            raise TypeError(
                f"{key!r}: field {name!r} is a {type(v).__name__}, which a store cannot hold; "
                "return an array, a number or a str"
            )
        if array.dtype == np.float64:
            raise TypeError(
                f"{key!r}: field {name!r} is float64 (a Python float, or an array of them); "
                "declare its type with fields={...} (e.g. tsc.Fixed((), \"float32\")), or return "
                "float32, so that a store never doubles its size by accident"
            )
        schema.append((name, Fixed(tuple(int(d) for d in array.shape), array.dtype.name)))
    if not schema:
        raise ValueError(f"{key!r}: the loader's record has no field")
    return tuple(schema)
