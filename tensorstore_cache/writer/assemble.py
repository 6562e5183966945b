"""Assembling a store in a hidden directory, then publishing it with one rename.

Every store is written the same way, whether a build computed its vectors, a
skip-mode build drops the rows that failed, or a cache compaction merges
parts: shard files (:func:`write_shard_file`, the one place that creates a
shard's directories), then the index and the array metadata
(:func:`finish_store`), then, once every file and directory of the store is
on disk (:func:`seal`, one :func:`~tensorstore_cache.fs.fsync_tree` of the
whole directory: the files were written with ``sync=False``, their
writing-back started as each was written), the group metadata last and the
rename (:func:`publish`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import BuildError, CorruptStoreError, StoreExistsError
from ..format import (
    GROUP,
    INDEX_ARRAYS,
    FieldLayout,
    GroupMetadata,
    StoreSpec,
    array_documents,
    encode_key,
    hash_encoded,
    index_array_metadata,
    write_shard,
)
from ..fs import (
    EXPLICIT,
    Trust,
    discard_tree,
    exchange_dirs,
    fsync_dir,
    fsync_tree,
    io_step,
    make_dir,
    temp_path,
    write_bytes_durable,
    write_json_durable,
)

__all__ = [
    "finish_store",
    "publish",
    "rewrite_rows",
    "seal",
    "write_index",
    "write_shard_file",
]

_QUIET = Trust.explicit(warn=False)
#: File entries of a store being written: store-relative path -> (size, xxh3-128 hex).
Files = dict[str, tuple[int, str]]


def write_shard_file(
    root: Path,
    rel: str,
    block: npt.NDArray[np.generic],
    rows_per_shard: int,
    trust: Trust = EXPLICIT,
) -> tuple[int, str]:
    """Write shard ``rel`` of the store being assembled in ``root``, durably.

    ``rel`` is ``<array>/c/<k>/...``. Creates the shard's directories below
    ``root/<array>`` only (which must exist: a late or retried task of an
    abandoned build fails instead of recreating it) and writes the file
    atomically (a retried task overwrites what a killed attempt left), its
    writing-back started: :func:`seal` makes the whole store durable before it
    is published. Directories and the file get the modes of ``trust``.

    Returns
    -------
    tuple of (int, str)
        The file's size and XXH3-128.
    """
    array, _c, rest = rel.partition("/c/")
    base = root / array
    path = root / rel
    d = base
    for part in ["c", *rest.split("/")[:-1]]:  # "c", shard number, "0"...
        d = d / part
        make_dir(d, trust)
    return write_shard(path, block, rows_per_shard, trust=trust, sync=False)


def rewrite_rows(
    root: Path,
    layout: FieldLayout,
    read: Callable[[npt.NDArray[np.int64]], npt.NDArray[Any]],
    trust: Trust = EXPLICIT,
) -> Files:
    """Write every shard of a fixed field into ``root`` from existing rows; return their entries.

    Parameters
    ----------
    root
        The store being assembled (``root/<field's array>`` must exist).
    layout
        The new store's field (``n`` rows in shards of ``rows_per_shard``).
    read
        Returns the values of new rows ``rows`` (an ascending run), e.g. a
        gather from the mapped files of other stores.
    trust
        The modes of what is created (see :mod:`tensorstore_cache.fs.trust`).
    """
    s = layout.rows_per_shard
    files: Files = {}
    for k in range(layout.shard_count()):
        rows = np.arange(k * s, min(layout.n, (k + 1) * s), dtype=np.int64)
        rel = layout.chunk_key(k)
        files[rel] = write_shard_file(root, rel, read(rows), s, trust)
    return files


def write_index(
    root: Path,
    keys: list[str],
    sizes: npt.NDArray[np.int64],
    mtimes: npt.NDArray[np.int64],
    trust: Trust = EXPLICIT,
) -> tuple[Files, int]:
    """Write the index arrays and their metadata into ``root`` (modes of ``trust``).

    Returns
    -------
    files : dict
        Their file entries.
    key_bytes_len : int
        Length of the ``key_bytes`` array.
    """
    encoded = [encode_key(k) for k in keys]
    hashes = hash_encoded(encoded)
    order = np.argsort(hashes, kind="stable")
    lengths = np.fromiter((len(e) for e in encoded), dtype=np.uint64, count=len(encoded))
    offsets = np.zeros(len(keys) + 1, dtype=np.uint64)
    np.cumsum(lengths, out=offsets[1:])
    arrays: dict[str, npt.NDArray[Any]] = {
        "key_hash": hashes[order],
        "key_row": order.astype(np.int64),
        "key_offsets": offsets,
        "key_bytes": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        "source_size": sizes,
        "source_mtime_ns": mtimes,
    }
    files: Files = {}
    for name, dtype in INDEX_ARRAYS.items():
        data = np.ascontiguousarray(arrays[name], dtype=np.dtype(dtype).newbyteorder("<"))
        make_dir(root / name, trust, exist_ok=False)
        files[f"{name}/{GROUP}"] = write_json_durable(
            root / name / GROUP, index_array_metadata(name, len(data)), trust=trust, sync=False
        )
        if len(data):
            make_dir(root / name / "c", trust, exist_ok=False)
            files[f"{name}/c/0"] = write_bytes_durable(
                root / name / "c" / "0", data.reshape(-1).view(np.uint8).data, trust=trust,
                sync=False,
            )
    return files, int(arrays["key_bytes"].nbytes)


def finish_store(
    tmp: Path,
    spec: StoreSpec,
    files: Files,
    *,
    keys: list[str],
    sizes: npt.NDArray[np.int64],
    mtimes: npt.NDArray[np.int64],
    trust: Trust = EXPLICIT,
) -> GroupMetadata:
    """Write the vectors' metadata and the index beside written shards.

    Parameters
    ----------
    tmp
        The unpublished store directory, its shards written.
    spec
        The store's spec.
    files
        File entries of the shards.
    keys, sizes, mtimes
        Every key in row order, and its source's identity.
    trust
        The modes of what is created.

    Returns
    -------
    GroupMetadata
        The group metadata to publish with :func:`publish`.
    """
    every = dict(files)
    docs = array_documents(spec, 0)  # the index arrays' are written with their data below
    for directory in sorted((d for d in docs if d not in INDEX_ARRAYS), key=_depth_last):
        if not (tmp / directory).is_dir():
            make_dir(tmp / directory, trust)
        every[f"{directory}/{GROUP}"] = write_json_durable(
            tmp / directory / GROUP, docs[directory], trust=trust, sync=False
        )
    index_files, key_bytes_len = write_index(tmp, keys, sizes, mtimes, trust)
    every.update(index_files)
    return GroupMetadata(spec=spec, files=every, key_bytes_len=key_bytes_len)


def _depth_last(directory: str) -> tuple[int, str]:
    """Deepest directories first: a group's ``zarr.json`` after those of its arrays."""
    return (-directory.count("/"), directory)


def seal(tmp: Path, meta: GroupMetadata, target: str, trust: Trust = EXPLICIT) -> None:
    """Make everything in ``tmp`` durable (:func:`~tensorstore_cache.fs.fsync_tree`), then
    write the group metadata into it and check it as every reader will.

    ``trust`` gives the group metadata its mode, and the finished store is
    read back under it (a cache's part must pass the checks of its readers;
    a store at a path the user names is not warned about here).

    Raises
    ------
    BuildError
        If the finished store fails the checks every reader applies (nothing
        is to be published at ``target``).
    """
    fsync_tree(tmp)  # every file and directory on disk, then the group metadata last
    meta.write(tmp, trust=trust)
    try:  # publish only what readers accept (e.g. not metadata past their size caps)
        GroupMetadata.read(tmp, trust=trust if trust.kind != "explicit" else _QUIET)
    except CorruptStoreError as exc:
        raise BuildError(
            f"the finished store fails the checks every reader applies, so nothing was "
            f"published at {target!r}: {exc}"
        ) from exc


def publish(
    tmp: Path, target: Path, meta: GroupMetadata, *, overwrite: bool, trust: Trust = EXPLICIT
) -> None:
    """Write the group metadata last (:func:`seal`, under ``trust``), then publish ``tmp``
    as ``target`` with one rename.

    Raises
    ------
    BuildError
        If the finished store fails the checks every reader applies (nothing
        is published).
    StoreExistsError
        If ``target`` appeared meanwhile and ``overwrite`` is false.
    """
    seal(tmp, meta, str(target), trust)
    old: Path | None = None
    if overwrite and (target.exists() or target.is_symlink()):
        # one atomic swap where the system has it: readers see the old or the new store
        io_step("rename")
        if exchange_dirs(tmp, target):
            fsync_dir(target.parent)
            if tmp.is_symlink():
                tmp.unlink()
            discard_tree(tmp)
            return
        # a temporary name of the target, so collect_debris removes it if we die here
        old = temp_path(target, "gc")
        io_step("rename")
        target.rename(old)
    try:
        io_step("rename")
        tmp.rename(target)
    except OSError as exc:
        if old is not None:
            old.rename(target)
        raise StoreExistsError(
            f"{str(target)!r} appeared while building ({exc}); another process published it "
            "first - open it with tensorstore_cache.open_store"
        ) from None
    fsync_dir(target.parent)
    if old is not None:
        discard_tree(old)
