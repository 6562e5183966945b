"""How a source path becomes a key, and how keys are hashed.

A key is ``posixpath.normpath(os.fspath(path))``: the path as the caller wrote
it, with redundant separators and ``.`` components removed. Relative paths are
*not* resolved against the working directory, so the same relative path names
the same entry on every machine. A key is stored as its UTF-8 bytes (with
``surrogateescape`` for undecodable file names) and hashed with XXH3-64
(seed 0), which is stable across processes, machines and Python versions.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union

import numpy as np
import numpy.typing as npt
import xxhash

__all__ = [
    "PathLike",
    "encode_key",
    "encode_keys",
    "hash_encoded",
    "hash_key",
    "normalize_key",
    "normalize_keys",
    "path_sequence",
]

PathLike = Union[str, "os.PathLike[str]"]


def normalize_key(path: object) -> str:
    """Return the key of one source path.

    Parameters
    ----------
    path
        A ``str`` or ``os.PathLike``.

    Returns
    -------
    str
        The normalised key.

    Raises
    ------
    TypeError
        If ``path`` is not a string or path-like object.
    ValueError
        If ``path`` is empty or contains a NUL character.

    Examples
    --------
    >>> normalize_key("data//images/./0001.jpg")
    'data/images/0001.jpg'
    """
    if type(path) is str:
        raw = path
        # fast path: a path normpath would leave unchanged
        if raw and "//" not in raw and "/." not in raw and raw[0] != "." and raw[-1] != "/" and "\x00" not in raw:
            return raw
    else:
        try:
            fs = os.fspath(path)  # type: ignore[call-overload]
        except TypeError:
            raise TypeError(
                f"a path must be a str or os.PathLike, got {type(path).__name__}: {path!r}"
            ) from None
        raw = os.fsdecode(fs) if isinstance(fs, bytes) else fs
    if not raw:
        raise ValueError("a path must not be empty")
    if "\x00" in raw:
        raise ValueError(f"a path must not contain NUL characters: {raw!r}")
    return posixpath.normpath(raw)


def normalize_keys(paths: Iterable[object]) -> list[str]:
    """Normalise every path of an iterable (a list, a pandas Series, ...).

    Parameters
    ----------
    paths
        Any iterable of ``str`` or ``os.PathLike``.

    Returns
    -------
    list of str
        The keys, in input order, duplicates kept.
    """
    values = path_sequence(paths)
    if isinstance(values, np.ndarray):
        values = values.tolist()  # numpy str_ items become str
    if _all_keys(values):
        return list(values)
    return [normalize_key(p) for p in values]


def _all_keys(paths: Sequence[Any]) -> bool:
    """Whether every path of ``paths`` is a ``str`` that already is its own key.

    One join and a few vectorised passes (:func:`_plain`) instead of a call of
    :func:`normalize_key` per path; False sends the caller key by key.
    """
    if len(paths) == 0 or set(map(type, paths)) != {str}:  # keys are plain str
        return False
    try:
        joined = "\x00".join(paths).encode("utf-8", "surrogateescape")
    except (TypeError, UnicodeEncodeError):  # not all str (os.PathLike...)
        return False
    # a path holding a NUL would add a separator: normalize_key must reject it
    return _plain(joined) and joined.count(b"\x00") == len(paths) - 1


def path_sequence(paths: Iterable[object]) -> Sequence[Any]:
    """Return the paths of an iterable as a sequence (a pandas Series as its array).

    Raises
    ------
    TypeError
        If ``paths`` is one path (a ``str``, ``bytes`` or ``os.PathLike``)
        rather than an iterable of them.
    """
    values: Any = getattr(paths, "values", paths)  # a pandas Series -> its ndarray
    if isinstance(values, (str, bytes, os.PathLike)):
        raise TypeError(
            f"paths must be an iterable of paths, not a single path: {values!r}; "
            "wrap it in a list"
        )
    if not isinstance(values, (list, tuple, np.ndarray)):
        # A pandas extension array (pandas 3 stores strings in Arrow) yields its items
        # one Python call each when iterated; its tolist() converts them in one pass.
        tolist = getattr(values, "tolist", None)
        converted = tolist() if callable(tolist) else None
        values = converted if isinstance(converted, list) else list(values)
    return values  # type: ignore[no-any-return]


def encode_key(key: str) -> bytes:
    """Return the stored bytes of a normalised key."""
    return key.encode("utf-8", "surrogateescape")


_SLASH, _DOT = ord("/"), ord(".")


#: Bytes of joined keys checked per vectorised step of :func:`_plain`: its temporaries
#: (a few bytes per byte) stay well below glibc's initial mmap threshold (128 KiB), so they
#: are reused from the heap instead of raising the threshold and growing the heap for good.
_PLAIN_BLOCK = 16 << 10


def _plain(joined: bytes) -> bool:
    """Whether every key in ``joined`` (encoded keys separated by NUL) is its own key.

    The conditions of :func:`normalize_key`'s fast path, checked for a whole
    chunk with a few vectorised comparisons of each byte with the next one
    instead of a call per path: no key is empty, starts with ``.``, ends with
    ``/``, or holds ``//`` or ``/.``. (The encoding of any other character has
    no byte below 0x80.) It works in blocks of :data:`_PLAIN_BLOCK` bytes.
    """
    if not joined or joined[0] in (0, _DOT) or joined[-1] in (0, _SLASH):
        return False
    data = np.frombuffer(joined, dtype=np.uint8)
    last = len(data) - 1  # pairs (data[i], data[i + 1]) for i < last
    for start in range(0, last, _PLAIN_BLOCK):
        first = data[start : min(start + _PLAIN_BLOCK, last)]
        then = data[start + 1 : start + 1 + len(first)]
        slash = first == _SLASH
        # a pair "/" + one of "/", "." or NUL: "//", "/.", a key ending with "/"
        bad = slash & (((then | 1) == _SLASH) | (then == 0))
        # NUL + "." or NUL: a key starting with ".", an empty key
        bad |= (first == 0) & ((then == _DOT) | (then == 0))
        if bad.any():
            return False
    return True


def encode_keys(paths: Sequence[Any] | npt.NDArray[Any]) -> tuple[Sequence[str], list[bytes]]:
    """Normalise and encode many paths at once (the bulk form of the two above).

    Parameters
    ----------
    paths
        ``str`` or ``os.PathLike`` values (a list, a tuple, an ndarray).

    Returns
    -------
    keys : sequence of str
        The normalised keys (``paths`` itself when every path already is one).
    encoded : list of bytes
        Their stored bytes, in order.

    Raises
    ------
    TypeError, ValueError
        As :func:`normalize_key`, for the first bad path.
    """
    if len(paths) == 0:
        return [], []
    try:
        joined = "\x00".join(paths).encode("utf-8", "surrogateescape")
    except (TypeError, UnicodeEncodeError):  # not all str (os.PathLike...): key by key
        joined = b""
    if _plain(joined):
        encoded = joined.split(b"\x00")
        if len(encoded) == len(paths):  # else a path holds a NUL: normalize_key says so
            return paths, encoded  # type: ignore[return-value]
    keys = [normalize_key(p) for p in paths]
    encoded = "\x00".join(keys).encode("utf-8", "surrogateescape").split(b"\x00")
    return keys, encoded


hash_key: Callable[[bytes], int] = xxhash.xxh3_64_intdigest
"""XXH3-64 of one encoded key, as a Python int (the function itself: no wrapper call)."""


def hash_encoded(encoded: Sequence[bytes]) -> npt.NDArray[np.uint64]:
    """Hash encoded keys with XXH3-64.

    Parameters
    ----------
    encoded
        Keys as returned by :func:`encode_key`.

    Returns
    -------
    numpy.ndarray
        ``uint64`` hashes, one per key.
    """
    return np.fromiter(map(hash_key, encoded), dtype=np.uint64, count=len(encoded))
