"""The on-disk layout: names, array metadata, and the group metadata, read and written.

A store is a zarr v3 group. This module builds the exact ``zarr.json``
documents the writer emits and checks, before anything is mapped, that a
store's metadata is one of those documents (an allowlist: any other dtype,
codec, chunking or attribute is rejected). :class:`GroupMetadata` is the one
description of a store's group document: parsed by readers, written by
builds and merges. Format 1 holds one ``vectors`` array; format 2 the arrays
of named fields (:mod:`tensorstore_cache.format.fields`) under ``fields/``.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np

from .. import config
from ..errors import CorruptStoreError, StoreNotFoundError
from ..fs import (
    StoreWalk,
    Trust,
    fsync_dir,
    json_file_is,
    json_record,
    read_json,
    write_json_durable,
)
from .fields import FIELDS, MAX_FIELDS, FieldLayout, Fixed, Ragged, schema_from_json
from .spec import FORMAT_VERSION, RECORDS_VERSION, StoreSpec

__all__ = [
    "ATTR_KEY",
    "DTYPES",
    "GROUP",
    "GROUP_DOCUMENT",
    "GroupMetadata",
    "INDEX_ARRAYS",
    "VECTORS",
    "array_documents",
    "data_files",
    "expected_files",
    "fetched_dirs",
    "fetched_files",
    "file_count",
    "first_file_ids",
    "fixed_metadata",
    "index_array_length",
    "index_array_metadata",
    "shard_count",
    "shard_key",
    "vectors_metadata",
]

#: Group attribute that holds the store's description.
ATTR_KEY = "tensorstore_cache"
#: The group metadata file (written last: it is the store's commit record).
GROUP = "zarr.json"
#: Name of the array of vectors.
VECTORS = "vectors"
#: One-dimensional index arrays: name -> (dtype, length is n or n + 1 or bytes).
INDEX_ARRAYS: dict[str, str] = {
    "key_hash": "uint64",  # XXH3-64 of every key, ascending
    "key_row": "int64",  # row of the key at the same position of key_hash
    "key_offsets": "uint64",  # n + 1 offsets into key_bytes, in row order
    "key_bytes": "uint8",  # UTF-8 keys, concatenated in row order
    "source_size": "int64",  # st_size of each source at build time, -1 if unknown
    "source_mtime_ns": "int64",  # st_mtime_ns of each source at build time, -1 if unknown
}
#: Element types a store may hold (zarr v3 names, always little-endian).
DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
_MAX_N = 1 << 40
_MAX_ITEM_BYTES = 1 << 31
_MAX_DIMS = 8
_HEX128 = re.compile(r"[0-9a-f]{32}")


def _fill(dtype: str) -> Any:
    if dtype == "bool":
        return False
    return 0.0 if dtype.startswith("float") else 0


def _bytes_codec() -> dict[str, Any]:
    return {"name": "bytes", "configuration": {"endian": "little"}}


def _array(shape: list[int], chunk: list[int], dtype: str, codecs: list[Any]) -> dict[str, Any]:
    return {
        "shape": shape,
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": _fill(dtype),
        "codecs": codecs,
        "attributes": {},
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def fixed_metadata(layout: FieldLayout) -> dict[str, Any]:
    """Return the ``zarr.json`` of a fixed field's sharded array (``vectors`` in format 1)."""
    item = list(layout.field.shape)
    sharding = {
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": [1, *item],
            "codecs": [_bytes_codec()],
            "index_codecs": [_bytes_codec(), {"name": "crc32c"}],
            "index_location": "end",
        },
    }
    return _array([layout.n, *item], [layout.rows_per_shard, *item], layout.dtype, [sharding])  # type: ignore[list-item]


def vectors_metadata(spec: StoreSpec) -> dict[str, Any]:
    """Return the ``zarr.json`` of the ``vectors`` array of ``spec`` (format 1)."""
    return fixed_metadata(spec.layouts()[0])


def index_array_length(name: str, spec: StoreSpec, key_bytes_len: int) -> int:
    """Return the length of index array ``name``."""
    if name == "key_offsets":
        return spec.n + 1
    if name == "key_bytes":
        return key_bytes_len
    return spec.n


def index_array_metadata(name: str, length: int) -> dict[str, Any]:
    """Return the ``zarr.json`` of a one-dimensional, single-chunk index array."""
    return _array([length], [max(length, 1)], INDEX_ARRAYS[name], [_bytes_codec()])


#: The ``zarr.json`` of a group inside a store (``fields/``, a ragged field's).
GROUP_DOCUMENT: dict[str, Any] = {"attributes": {}, "zarr_format": 3, "node_type": "group"}


def array_documents(spec: StoreSpec, key_bytes_len: int) -> dict[str, dict[str, Any]]:
    """Return the ``zarr.json`` of every array and inner group of a store, by directory."""
    docs: dict[str, dict[str, Any]] = {}
    if spec.records:
        docs[FIELDS] = GROUP_DOCUMENT
    for layout in spec.layouts():
        if isinstance(layout.field, Fixed):
            docs[layout.path] = fixed_metadata(layout)
            continue
        n = layout.n
        docs[layout.path] = GROUP_DOCUMENT
        docs[f"{layout.path}/values"] = _array(
            list(layout.values_shape), [layout.chunk, *layout.field.inner], layout.dtype,
            [_bytes_codec()],
        )
        docs[f"{layout.path}/offsets"] = _array([n + 1], [n + 1], "uint64", [_bytes_codec()])
        if isinstance(layout.field, Ragged) and layout.field.flat:
            k = len(layout.field.varying)
            docs[f"{layout.path}/shapes"] = _array([n, k], [max(n, 1), k], "int32",
                                                   [_bytes_codec()])
    for name in INDEX_ARRAYS:
        docs[name] = index_array_metadata(name, index_array_length(name, spec, key_bytes_len))
    return docs


def shard_count(spec: StoreSpec) -> int:
    """Return the number of shard files of ``spec``'s vectors (format 1)."""
    return math.ceil(spec.n / spec.rows_per_shard)


def shard_key(spec: StoreSpec, k: int) -> str:
    """Return the store-relative path of shard ``k`` of the vectors (format 1)."""
    assert spec.item_shape is not None
    return posixpath.join(VECTORS, "c", str(k), *(["0"] * len(spec.item_shape)))


def fetched_files(spec: StoreSpec) -> list[str]:
    """Every file a reader may fetch on demand, in the order of their ids (their position here).

    The shards of every fixed field (``vectors`` in format 1) and the
    ``values`` chunks of every ragged or text field, field by field in
    schema order, each field's files in order: in format 1, shard ``k`` of
    the vectors has id ``k``. The rest (metadata, index, offsets, shapes)
    is small and comes with the index. Ids are derived from the spec
    alone, so every process of a node agrees on them (they number the
    node cache's holds, see :mod:`tensorstore_cache.fs.ranges`).

    Examples
    --------
    >>> spec = StoreSpec(n=5, item_shape=(4,), dtype="float32", loader_id="x",
    ...                  loader_params={}, rows_per_shard=2)
    >>> fetched_files(spec)
    ['vectors/c/0/0', 'vectors/c/1/0', 'vectors/c/2/0']
    """
    return [key for layout in spec.layouts() for key in layout.chunk_keys()]


def first_file_ids(spec: StoreSpec) -> dict[str, int]:
    """The id (see :func:`fetched_files`) of the first file of every field, by field name.

    Examples
    --------
    >>> spec = StoreSpec(n=5, item_shape=(4,), dtype="float32", loader_id="x",
    ...                  loader_params={}, rows_per_shard=2)
    >>> first_file_ids(spec)
    {'vectors': 0}
    """
    out: dict[str, int] = {}
    first = 0
    for layout in spec.layouts():
        out[layout.name] = first
        first += layout.shard_count()
    return out


def fetched_dirs(spec: StoreSpec) -> dict[str, int]:
    """The directory of every field's fetched files (``<array>/c``), with the id of its file 0.

    File ``k`` of a field lies in ``<directory>/<k>/0...`` and has id
    ``first + k`` (see :func:`fetched_files`).

    Examples
    --------
    >>> spec = StoreSpec(n=5, item_shape=(4,), dtype="float32", loader_id="x",
    ...                  loader_params={}, rows_per_shard=2)
    >>> fetched_dirs(spec)
    {'vectors/c': 0}
    """
    firsts = first_file_ids(spec)
    out: dict[str, int] = {}
    for layout in spec.layouts():
        array = layout.path if isinstance(layout.field, Fixed) else f"{layout.path}/values"
        out[f"{array}/c"] = firsts[layout.name]
    return out


def data_files(spec: StoreSpec, key_bytes_len: int) -> list[str]:
    """Return every data file (shards, chunks, offsets, shapes, index arrays) of ``spec``."""
    files: list[str] = []
    for layout in spec.layouts():
        files.extend(layout.chunk_keys())
        if not isinstance(layout.field, Fixed):
            files.append(f"{layout.path}/offsets/c/0")
            if isinstance(layout.field, Ragged) and layout.field.flat and layout.n:
                files.append(f"{layout.path}/shapes/c/0/0")
    for name in INDEX_ARRAYS:
        if index_array_length(name, spec, key_bytes_len) > 0:
            files.append(f"{name}/c/0")
    return files


def file_count(spec: StoreSpec, key_bytes_len: int) -> int:
    """How many files :func:`expected_files` lists, counted without listing them."""
    count = 1 if spec.records else 0  # fields/zarr.json
    for layout in spec.layouts():
        count += layout.shard_count()
        if isinstance(layout.field, Fixed):
            count += 1  # its zarr.json
            continue
        count += 4  # the field's group, values and offsets zarr.json, offsets/c/0
        if isinstance(layout.field, Ragged) and layout.field.flat:
            count += 1 + (layout.n > 0)  # shapes zarr.json and shapes/c/0/0
    return count + sum(
        1 + (index_array_length(name, spec, key_bytes_len) > 0) for name in INDEX_ARRAYS
    )


def expected_files(
    spec: StoreSpec, key_bytes_len: int, documents: dict[str, dict[str, Any]] | None = None
) -> set[str]:
    """Return every file a store of ``spec`` consists of, except the group ``zarr.json``
    (``documents``: its :func:`array_documents`, when the caller has them)."""
    if documents is None:
        documents = array_documents(spec, key_bytes_len)
    files = {f"{d}/{GROUP}" for d in documents}
    files.update(data_files(spec, key_bytes_len))
    return files


def _int(value: Any, what: str, lo: int, hi: int, where: str) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise CorruptStoreError(
            f"{where}: {what} must be an integer in [{lo}, {hi}], got {value!r}", where
        )
    return value


def _spec_from_attrs(
    attrs: Any, where: str
) -> tuple[StoreSpec, dict[str, tuple[int, str]], int, dict[str, dict[str, Any]]]:
    if not isinstance(attrs, dict):
        raise CorruptStoreError(f"{where}: attribute {ATTR_KEY!r} must be an object", where)
    version = attrs.get("format_version")
    if version not in (FORMAT_VERSION, RECORDS_VERSION):
        raise CorruptStoreError(
            f"{where}: format version {version!r} is not supported by this release "
            f"(it reads versions {FORMAT_VERSION} and {RECORDS_VERSION}); upgrade "
            "tensorstore_cache or rebuild the store",
            where,
        )
    n = _int(attrs.get("n"), "n", 0, _MAX_N, where)
    rows = _int(attrs.get("rows_per_shard"), "rows_per_shard", 1, _MAX_N, where)
    item_shape: tuple[int, ...] | None = None
    dtype: str | None = None
    fields: tuple[FieldLayout, ...] = ()
    if version == FORMAT_VERSION:
        item_shape, dtype = _vector_from_attrs(attrs, rows, where)
    else:
        fields = _fields_from_attrs(attrs.get("fields"), n, where)
    loader_id, params, skipped, created, identity = _provenance_from_attrs(attrs, where)
    key_bytes_len = _int(attrs.get("key_bytes_len"), "key_bytes_len", 0, 1 << 48, where)
    spec = StoreSpec(
        n=n,
        item_shape=item_shape,
        dtype=dtype,
        loader_id=loader_id,
        loader_params=params,
        format_version=version,
        rows_per_shard=rows,
        skipped=skipped,
        created_unix=created,
        fields=fields,
        identity=identity,
    )
    documents = array_documents(spec, key_bytes_len)
    files = _files_from_attrs(attrs.get("files"), spec, key_bytes_len, documents, where)
    return spec, files, key_bytes_len, documents


def _vector_from_attrs(attrs: dict[str, Any], rows: int, where: str) -> tuple[tuple[int, ...], str]:
    """A format-1 store's item shape and dtype, checked (sizes capped)."""
    shape = attrs.get("item_shape")
    if not isinstance(shape, list) or not 1 <= len(shape) <= _MAX_DIMS:
        raise CorruptStoreError(f"{where}: item_shape must be a list of 1 to 8 sizes", where)
    item_shape = tuple(_int(d, "an item_shape size", 1, _MAX_ITEM_BYTES, where) for d in shape)
    dtype = _dtype(attrs.get("dtype"), where)
    itemsize = np.dtype(dtype).itemsize
    if math.prod(item_shape) * itemsize > _MAX_ITEM_BYTES:
        raise CorruptStoreError(f"{where}: item_shape {list(item_shape)} is too large", where)
    if rows * math.prod(item_shape) * itemsize > (1 << 40):
        raise CorruptStoreError(f"{where}: shards of {rows} rows are too large", where)
    return item_shape, dtype


def _provenance_from_attrs(
    attrs: dict[str, Any], where: str
) -> tuple[str, dict[str, Any], tuple[tuple[str, str], ...], float, Any]:
    """The loader, its parameters, the skipped sources, the creation time and the source
    identity a store records, each checked."""
    loader_id = attrs.get("loader_id")
    if not isinstance(loader_id, str) or len(loader_id) > 1000:
        raise CorruptStoreError(f"{where}: loader_id must be a short string", where)
    params = attrs.get("loader_params")
    if not isinstance(params, dict):
        raise CorruptStoreError(f"{where}: loader_params must be an object", where)
    skipped_raw = attrs.get("skipped", [])
    if not isinstance(skipped_raw, list) or not all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s)
        for s in skipped_raw
    ):
        raise CorruptStoreError(f"{where}: skipped must be a list of [path, reason]", where)
    created = attrs.get("created_unix", 0.0)
    if not isinstance(created, (int, float)):
        raise CorruptStoreError(f"{where}: created_unix must be a number", where)
    identity = attrs.get("source_identity", "stat")
    if identity not in get_args(config.Recorded):
        raise CorruptStoreError(
            f"{where}: source_identity must be {config.choices(config.Recorded)}, got "
            f"{identity!r}", where
        )
    skipped = tuple((s[0], s[1]) for s in skipped_raw)
    return loader_id, params, skipped, float(created), identity


def _files_from_attrs(
    files_raw: Any, spec: StoreSpec, key_bytes_len: int,
    documents: dict[str, dict[str, Any]], where: str,
) -> dict[str, tuple[int, str]]:
    """The size and checksum of every file of the store ``spec`` describes, checked: exactly
    the files its shape needs, each ``[size, xxh3-128 hex]``."""
    if not isinstance(files_raw, dict):
        raise CorruptStoreError(f"{where}: files must be an object", where)
    count = file_count(spec, key_bytes_len)  # counted before listing them: n may be hostile
    if len(files_raw) != count:
        raise CorruptStoreError(
            f"{where}: the file list has {len(files_raw)} entries but a store of {spec.n} rows "
            f"in shards of {spec.rows_per_shard} needs {count}; the metadata is damaged",
            where,
        )
    expected = expected_files(spec, key_bytes_len, documents)
    if set(files_raw) != expected:
        odd = sorted(set(files_raw) ^ expected)[:3]
        raise CorruptStoreError(
            f"{where}: the file list does not match the store's shape (e.g. {odd}); "
            "the metadata is damaged",
            where,
        )
    # every entry at once, by comprehensions (no call per entry); one is named if bad
    entries = list(files_raw.values())
    sizes = [e[0] for e in entries] if {type(e) for e in entries} == {list} and {
        len(e) for e in entries} == {2} else None
    digests = [e[1] for e in entries] if sizes is not None else []
    if (
        sizes is None
        or {type(x) for x in sizes} != {int}
        or min(sizes) < 0
        or {type(d) for d in digests} != {str}
        or {len(d) for d in digests} != {32}
        or not _all_hex("".join(digests))
    ):
        bad = next(rel for rel, e in files_raw.items() if not _file_entry(e))
        raise CorruptStoreError(f"{where}: file entry for {bad!r} must be [size, xxh3-128 hex]",
                                where)
    return dict(zip(files_raw, zip(sizes, digests, strict=True), strict=True))


#: The characters of a hex digest (what :func:`_all_hex` deletes).
_HEX = b"0123456789abcdef"


def _all_hex(text: str) -> bool:
    """Whether ``text`` holds lowercase hex digits only."""
    try:
        return not text.encode("ascii").translate(None, _HEX)
    except UnicodeEncodeError:
        return False


def _file_entry(entry: Any) -> bool:
    """Whether a ``files`` entry is ``[size, xxh3-128 hex]``."""
    return (
        type(entry) is list and len(entry) == 2 and type(entry[0]) is int and entry[0] >= 0
        and isinstance(entry[1], str) and _HEX128.fullmatch(entry[1]) is not None
    )


def _dtype(value: Any, where: str) -> str:
    if not isinstance(value, str) or value not in DTYPES:
        raise CorruptStoreError(
            f"{where}: dtype {value!r} is not allowed; allowed: {sorted(DTYPES)}", where
        )
    return value


def _fields_from_attrs(raw: Any, n: int, where: str) -> tuple[FieldLayout, ...]:
    """The field list of a format-2 store, every entry checked (sizes capped, names allowed)."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_FIELDS:
        raise CorruptStoreError(f"{where}: fields must be a list of 1 to {MAX_FIELDS} fields",
                                where)
    try:
        schema = schema_from_json(raw)
    except ValueError as exc:
        raise CorruptStoreError(f"{where}: {exc}", where) from None
    out = []
    for (name, f), entry in zip(schema, raw, strict=True):
        kind = f"field {name!r}"
        if isinstance(f, Fixed):
            rows = _int(entry.get("rows_per_shard"), f"{kind}: rows_per_shard", 1, _MAX_N, where)
            if f.nbytes > _MAX_ITEM_BYTES or rows * max(f.nbytes, 1) > (1 << 40):
                raise CorruptStoreError(f"{where}: {kind} is too large", where)
            out.append(FieldLayout(name, f, n, rows_per_shard=rows, path=f"{FIELDS}/{name}"))
            continue
        chunk = _int(entry.get("chunk"), f"{kind}: chunk", 1, _MAX_N, where)
        total = _int(entry.get("total"), f"{kind}: total", 0, _MAX_N, where)
        layout = FieldLayout(name, f, n, chunk=chunk, total=total, path=f"{FIELDS}/{name}")
        if layout.row_nbytes > _MAX_ITEM_BYTES or chunk * max(layout.row_nbytes, 1) > (1 << 40):
            raise CorruptStoreError(f"{where}: {kind} is too large", where)
        if entry.get("kind") == "text" and set(entry) - {"name", "kind", "chunk", "total"}:
            raise CorruptStoreError(f"{where}: {kind} has keys a text field does not", where)
        out.append(layout)
    return tuple(out)


def _disagreement(meta: GroupMetadata, name: str, path: str, where: str) -> CorruptStoreError:
    """The error of an array's ``zarr.json`` that is not the one the group document needs:
    it names the array's document if the group document's record of it (size, checksum) is
    of the document it needs, else the group document, which then disagrees with itself."""
    if meta.files.get(f"{name}/{GROUP}") == json_record(meta.array_documents()[name]):
        return CorruptStoreError(
            f"{path} does not describe the array this store needs (dtype, shape, chunking and "
            "codecs must be exactly those written by tensorstore_cache)", path)
    return CorruptStoreError(
        f"{where} does not agree with itself: the array it describes at {name!r} is not the one "
        "whose size and checksum it records; the metadata is damaged - rebuild the store", where)


def _canonical(document: Any) -> str:
    """``document`` as one JSON text: equal for equal documents only (``1``, ``1.0`` and
    ``true`` differ, the order of keys does not matter)."""
    return json.dumps(document, sort_keys=True)


def _without_files(group: dict[str, Any]) -> dict[str, Any]:
    """A group document without its (separately checked) file list: shallow copies."""
    attributes = group["attributes"]
    attrs = {k: v for k, v in attributes[ATTR_KEY].items() if k != "files"}
    return {**group, "attributes": {**attributes, ATTR_KEY: attrs}}


def _parse_group(group: Any, where: str) -> tuple[GroupMetadata, dict[str, dict[str, Any]]]:
    """:meth:`GroupMetadata.from_json`, and the store's :func:`array_documents`."""
    if not isinstance(group, dict) or group.get("zarr_format") != 3 or group.get(
        "node_type"
    ) != "group":
        raise CorruptStoreError(f"{where} is not a zarr v3 group", where)
    attributes = group.get("attributes")
    if not isinstance(attributes, dict) or ATTR_KEY not in attributes:
        raise CorruptStoreError(
            f"{where} is a zarr group but not a tensorstore_cache store "
            f"(no {ATTR_KEY!r} attribute)",
            where,
        )
    spec, files, key_bytes_len, documents = _spec_from_attrs(attributes[ATTR_KEY], where)
    meta = GroupMetadata(spec=spec, files=files, key_bytes_len=key_bytes_len)
    # the file list was checked entry by entry (exactly the files the spec needs, each a list
    # of an int and a hex str): the rest of the document is compared whole
    if _canonical(_without_files(meta.to_json())) != _canonical(_without_files(group)):
        raise CorruptStoreError(
            f"{where} holds what this format never writes (a key it does not know, or a "
            "value written another way); the metadata is damaged - rebuild the store",
            where,
        )
    return meta, documents


def _read_group(
    where: str, root: Path, root_fd: int | StoreWalk, trust: Trust | None
) -> Any:
    """The group document of the store open at ``root_fd``; StoreNotFoundError if it has none."""
    try:
        return read_json(where, max_bytes=config.MAX_GROUP_JSON, root=root, root_fd=root_fd,
                         trust=trust)
    except CorruptStoreError:
        pinned = root_fd.root_fd if isinstance(root_fd, StoreWalk) else root_fd
        if not _exists(root, GROUP, pinned):  # missing: no store here (asked only then)
            raise StoreNotFoundError(f"{where} does not exist") from None
        raise


def _exists(root: Path, name: str, root_fd: int | None) -> bool:
    try:
        if root_fd is None:
            os.lstat(root / name)
        else:
            os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """A store's group ``zarr.json``: its spec and the size and checksum of every file.

    Examples
    --------
    >>> meta = GroupMetadata.read(Path("covers.tsc"))  # doctest: +SKIP
    >>> meta.spec.n, len(meta.files)                    # doctest: +SKIP
    (10000, 23)
    """

    spec: StoreSpec
    """What the store holds."""
    files: dict[str, tuple[int, str]]
    """Store-relative path -> ``(size, xxh3-128 hex)`` of every file but the group ``zarr.json``."""
    key_bytes_len: int
    """Length of the ``key_bytes`` index array."""

    @classmethod
    def from_json(cls, group: Any, where: str) -> GroupMetadata:
        """Validate a decoded group document; ``where`` names it in errors.

        Raises
        ------
        CorruptStoreError
            If it differs in anything from what this format allows.
        """
        return _parse_group(group, where)[0]

    def to_json(self) -> dict[str, Any]:
        """Return the group document (as written to ``zarr.json``)."""
        attrs = self.spec.to_json()
        attrs["key_bytes_len"] = self.key_bytes_len
        attrs["key_hash"] = "xxh3_64"
        attrs["checksum"] = "xxh3_128"
        attrs["files"] = {rel: [size, digest] for rel, (size, digest) in sorted(self.files.items())}
        return {"attributes": {ATTR_KEY: attrs}, "zarr_format": 3, "node_type": "group"}

    def array_documents(self) -> dict[str, dict[str, Any]]:
        """Return the ``zarr.json`` of every array and inner group of the store, by directory."""
        return array_documents(self.spec, self.key_bytes_len)

    @classmethod
    def read(
        cls, root: Path, root_fd: int | StoreWalk | None = None, *, trust: Trust | None = None
    ) -> GroupMetadata:
        """Read and validate every metadata file of the store at ``root``.

        ``root_fd``, a descriptor of ``root``, makes every file be read from that
        directory even if another one is renamed to ``root`` meanwhile. ``trust``
        is checked on every directory and file opened (see
        :func:`~tensorstore_cache.fs.opens.open_regular`).

        Raises
        ------
        StoreNotFoundError
            If ``root`` has no ``zarr.json``.
        CorruptStoreError
            If any metadata differs from what this format allows.
        """
        where = f"{root}/{GROUP}"  # strings: paths below root are built as text, once
        try:
            if root_fd is None:
                group = read_json(Path(where), max_bytes=config.MAX_GROUP_JSON, trust=trust)
            else:
                group = _read_group(where, root, root_fd, trust)
        except StoreNotFoundError:
            if _exists(root, VECTORS, root_fd.root_fd if isinstance(root_fd, StoreWalk) else root_fd):
                raise CorruptStoreError(
                    f"{where} is missing but {root} holds store data; the store's metadata was "
                    "deleted - rebuild the store",
                    where,
                ) from None
            raise
        meta, documents = _parse_group(group, where)
        seen: dict[bytes, Any] = {}  # documents decoded, by their bytes (several are alike)
        for name, expected in documents.items():
            path = f"{root}/{name}/{GROUP}"
            if not json_file_is(path, expected, max_bytes=config.MAX_ARRAY_JSON, root=root,
                                root_fd=root_fd, trust=trust, seen=seen):
                raise _disagreement(meta, name, path, where)
        return meta

    def write(self, root: Path, *, trust: Trust | None = None) -> None:
        """Write the group ``zarr.json`` into ``root`` durably (it must not exist yet).

        It gets the file mode of ``trust`` (default ``0o644`` through the umask).
        """
        write_json_durable(root / GROUP, self.to_json(), trust=trust)
        fsync_dir(root)
