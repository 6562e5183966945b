"""Building a store: decode in worker processes, write shards, publish atomically.

The coordinator plans the rows into shards, hands whole shards to workers
(never two writers in one shard), then writes the index and the metadata and
publishes the finished directory with a single ``rename``. Everything before
the rename happens in a hidden sibling directory, so a failed or killed build
leaves nothing at the target.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import textwrap
import time
from collections.abc import Iterable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._debris import collect_temp_siblings, discard, temp_sibling
from ._errors import BuildError, CorruptStoreError, StoreExistsError
from ._format import (
    ATTR_KEY,
    INDEX_ARRAYS,
    VECTORS,
    index_array_metadata,
    parse_group,
    shard_key,
    vectors_metadata,
)
from ._jsonio import exchange_dirs, fsync_dir, io_step, write_bytes_durable, write_json_durable
from ._keys import encode_key, hash_encoded, normalize_keys
from ._loader import ImageLoader
from ._reentry import building
from ._shard import remove_partials, write_shard
from ._spec import StoreSpec
from ._store import CacheStore, open_store
from ._tasks import Loader, ShardTask, load_item, run_tasks

__all__ = ["build_store", "collect_debris", "default_workers"]


#: Target size of one shard file.
SHARD_BYTES = 32 << 20
_TMP_MARK = ".tsc-build-"


def default_workers() -> int:
    """Return the number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _rows_per_shard(n: int, item_nbytes: int, workers: int) -> int:
    cap = max(1, SHARD_BYTES // max(item_nbytes, 1))
    # ~8 shards per worker so that work balances at the end and progress moves, but no
    # tiny shards
    return max(1, min(cap, max(math.ceil(n / (8 * workers)), min(n, 64))))


def _tmp_sibling(out: Path) -> Path:
    return temp_sibling(out, _TMP_MARK)


def collect_debris(out: Path, max_age_s: float = 24 * 3600.0) -> None:
    """Remove temporary build directories of ``out`` left by dead builders."""
    collect_temp_siblings(out.parent, f".{out.name}{_TMP_MARK}", max_age_s)


def _resolve_loader(
    loader: Loader | None, loader_id: str | None, size: tuple[int, int], dtype: str
) -> tuple[Loader, str, dict[str, Any], tuple[int, ...] | None]:
    if loader is None:
        image = ImageLoader(size=size, dtype=dtype)
        return image, loader_id or image.loader_id, dict(image.params), image.item_shape
    if not callable(loader):
        raise TypeError(f"loader must be a callable path -> array, got {loader!r}")
    params = dict(getattr(loader, "params", {}) or {})
    ident = loader_id or f"{getattr(loader, '__module__', '?')}.{getattr(loader, '__qualname__', type(loader).__qualname__)}"
    return loader, ident, params, getattr(loader, "item_shape", None)


def _probe(
    loader: Loader, keys: list[str], dtype: np.dtype[Any]
) -> tuple[int, npt.NDArray[Any]] | None:
    """Return the first key the loader succeeds on, as ``(index, value)``, or None.

    The value is kept and stored as it is: probing computes no item twice.
    """
    for i, key in enumerate(keys):
        try:
            return i, load_item(loader, key, dtype, None)
        except Exception:
            continue
    return None


def _write_index(
    root: Path, keys: list[str], sizes: npt.NDArray[np.int64], mtimes: npt.NDArray[np.int64]
) -> tuple[dict[str, list[Any]], int]:
    """Write the index arrays and their metadata; return their file entries."""
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
    files: dict[str, list[Any]] = {}
    import xxhash

    for name, dtype in INDEX_ARRAYS.items():
        data = np.ascontiguousarray(arrays[name], dtype=np.dtype(dtype).newbyteorder("<"))
        io_step("mkdir")
        (root / name).mkdir()
        write_json_durable(root / name / "zarr.json", index_array_metadata(name, len(data)))
        files[f"{name}/zarr.json"] = _file_entry(root / name / "zarr.json")
        if len(data):
            io_step("mkdir")
            (root / name / "c").mkdir()
            raw = data.tobytes()
            write_bytes_durable(root / name / "c" / "0", raw)
            files[f"{name}/c/0"] = [len(raw), xxhash.xxh3_128_hexdigest(raw)]
            fsync_dir(root / name / "c")
        fsync_dir(root / name)
    return files, int(arrays["key_bytes"].nbytes)


def _file_entry(path: Path) -> list[Any]:
    from ._shard import file_checksum

    size, digest = file_checksum(path)
    return [size, digest]


def finish_store(
    tmp: Path,
    spec: StoreSpec,
    files: dict[str, list[Any]],
    keys: list[str],
    sizes: npt.NDArray[np.int64],
    mtimes: npt.NDArray[np.int64],
) -> dict[str, Any]:
    """Write the vectors' metadata and the index beside written shards.

    Parameters
    ----------
    tmp
        The unpublished store directory, its shards written and fsynced.
    spec
        The store's spec.
    files
        File entries of the shards (completed in place with the others).
    keys, sizes, mtimes
        Every key in row order, and its source's identity.

    Returns
    -------
    dict
        The group attributes to publish with :func:`_publish`.
    """
    write_json_durable(tmp / VECTORS / "zarr.json", vectors_metadata(spec))
    files[f"{VECTORS}/zarr.json"] = _file_entry(tmp / VECTORS / "zarr.json")
    if (tmp / VECTORS / "c").exists():
        fsync_dir(tmp / VECTORS / "c")
    fsync_dir(tmp / VECTORS)
    index_files, key_bytes_len = _write_index(tmp, keys, sizes, mtimes)
    files.update(index_files)
    attrs = spec.to_json()
    attrs["key_bytes_len"] = key_bytes_len
    attrs["key_hash"] = "xxh3_64"
    attrs["checksum"] = "xxh3_128"
    attrs["files"] = dict(sorted(files.items()))
    return attrs


def _drop_failed_rows(root: Path, spec: StoreSpec, old_rows: list[int], keep: npt.NDArray[np.bool_]) -> tuple[StoreSpec, dict[str, list[Any]]]:
    """Rewrite the shards without the rows that failed (``on_error="skip"``)."""
    old_dir = root / VECTORS
    new_dir = root / (VECTORS + ".compact")
    s = spec.rows_per_shard
    kept = np.flatnonzero(keep)
    new_spec = dataclasses.replace(spec, n=len(kept))
    files: dict[str, list[Any]] = {}
    dtype = np.dtype(spec.dtype).newbyteorder("<")
    maps: dict[int, npt.NDArray[Any]] = {}

    def old_block(k: int) -> npt.NDArray[Any]:
        if k not in maps:
            rel = shard_key(spec, k)
            rows = old_rows[k]
            maps[k] = np.memmap(root / rel, dtype=dtype, mode="r", shape=(rows, *spec.item_shape))
        return maps[k]

    for j in range(math.ceil(len(kept) / s)):
        chunk = kept[j * s : (j + 1) * s]
        block = np.empty((len(chunk), *spec.item_shape), dtype=dtype)
        for i, row in enumerate(chunk.tolist()):
            block[i] = old_block(row // s)[row % s]
        rel = shard_key(new_spec, j)
        size, digest = write_shard(new_dir.parent / rel.replace(VECTORS, new_dir.name, 1), block, s)
        files[rel] = [size, digest]
    maps.clear()
    shutil.rmtree(old_dir)
    if new_dir.exists():
        new_dir.rename(old_dir)
    old_dir.mkdir(exist_ok=True)
    return new_spec, files


def build_store(
    paths: Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    size: tuple[int, int] = (32, 32),
    dtype: str = "float32",
    loader: Loader | None = None,
    loader_id: str | None = None,
    workers: int | None = None,
    on_error: str = "raise",
    progress: bool = True,
    overwrite: bool = False,
    executor: Executor | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> CacheStore:
    """Build a store of one vector per distinct path, publish it atomically, open it.

    Parameters
    ----------
    paths
        Source paths: any iterable of ``str``/``os.PathLike`` (a list, a pandas
        Series, ...). Duplicates are stored once; rows follow first appearance.
    out
        The store directory to create, or an fsspec URL (``s3://bucket/covers.tsc``;
        needs the ``remote`` extra): the store is then built in a local staging
        directory under ``<cache_dir>/remote/``, uploaded with its group
        ``zarr.json`` last, and kept there as this node's copy.
    size
        ``(height, width)`` of the default image loader.
    dtype
        Element type stored: ``"float32"`` (values of ``ToTensor``) or
        ``"uint8"`` (0..255, four times smaller; see :func:`to_float32`).
    loader
        Any callable ``path -> array`` of one fixed shape, used instead of the
        image loader. Each worker process receives it once, pickled with
        cloudpickle: by reference if it can be imported by name, by value
        otherwise (a function of ``__main__`` or of a notebook cell, a lambda,
        a closure, a :func:`functools.partial`). Without an ``item_shape``
        attribute, its first item is computed first, here, to learn the shape.
    loader_id
        A string naming the loader and its version, recorded in the spec.
    workers
        Processes that build (default: every core): this one and a pool of
        ``workers - 1`` started from a clean interpreter, which never runs
        ``__main__`` again. ``1`` builds in this process, as does a daemonic
        process (a DataLoader or multiprocessing pool worker), with a notice.
    on_error
        ``"raise"`` (default): if any source fails, raise :class:`BuildError`
        listing every failure and publish nothing. ``"skip"``: build the rest
        and record the skipped paths in ``spec.skipped``.
    progress
        Show a progress bar with items/s.
    overwrite
        Replace an existing store at ``out``.
    executor
        A :class:`concurrent.futures.Executor` to run the shard tasks on
        instead of a local process pool (e.g. ``dask.distributed.Client(...)
        .get_executor()``); every task writes one whole shard into the build
        directory next to ``out``, which must be on a filesystem all workers
        share. Tasks may be retried (a killed worker): a shard is written to a
        ``.partial`` file and renamed, so a retry replaces it safely. Pass
        ``workers=`` the cluster's thread count so that there are enough shards.
    cache_dir
        For a URL ``out``: the local cache directory (default
        ``$TSC_CACHE_DIR``, else ``~/.cache/tensorstore_cache``).
    storage_options
        For a URL ``out``: options of the fsspec filesystem.

    Returns
    -------
    CacheStore
        The published store, open.

    Raises
    ------
    BuildError
        If sources failed and ``on_error="raise"``.
    StoreExistsError
        If ``out`` exists and ``overwrite`` is false.
    ReentrantBuildError
        If called, for ``out``, by the loader of the build of ``out`` or by one
        of that build's worker processes.
    TypeError
        If ``workers > 1`` and the loader cannot be pickled.

    Examples
    --------
    >>> store = build_store(df["img_path"], "covers.tsc", size=(32, 32))  # doctest: +SKIP
    >>> store[df["img_path"][0]].shape                                     # doctest: +SKIP
    (3, 32, 32)
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if isinstance(out, str) and "://" in out:
        from ._remote import build_remote, is_url

        if is_url(out):
            return build_remote(
                paths, out, overwrite=overwrite, cache_dir=cache_dir,
                storage_options=storage_options, size=size, dtype=dtype, loader=loader,
                loader_id=loader_id, workers=workers, on_error=on_error, progress=progress,
                executor=executor,
            )
    target = Path(os.fspath(out))
    with building(target):  # a loader or worker asking for this build fails at once
        if (target.exists() or target.is_symlink()) and not overwrite:
            raise StoreExistsError(
                f"{str(target)!r} already exists; pass overwrite=True to replace it, or open it "
                "with tensorstore_cache.open_store"
            )
        np_dtype = np.dtype(dtype)
        fn, ident, params, item_shape = _resolve_loader(loader, loader_id, size, np_dtype.name)
        keys = list(dict.fromkeys(normalize_keys(paths)))
        n = len(keys)
        nworkers = default_workers() if workers is None else int(workers)
        if nworkers < 1:
            raise ValueError(f"workers must be at least 1, got {workers!r}")
        probed = None
        if item_shape is None:
            if not keys:
                raise ValueError(
                    "no paths to build and the loader does not declare its item_shape; pass at "
                    "least one path or give the loader an item_shape attribute"
                )
            probed = _probe(fn, keys, np_dtype)
            item_shape = probed[1].shape if probed is not None else (0,)
        item_nbytes = int(np.prod(item_shape)) * np_dtype.itemsize
        rows_per_shard = _rows_per_shard(n, item_nbytes, nworkers)
        spec = StoreSpec(
            n=n,
            item_shape=tuple(item_shape),
            dtype=np_dtype.name,
            loader_id=ident,
            loader_params=params,
            rows_per_shard=rows_per_shard,
            created_unix=time.time(),
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        collect_debris(target)
        tmp = _tmp_sibling(target)
        io_step("mkdir")
        tmp.mkdir()
        try:
            attrs = _build_into(tmp, spec, keys, fn, nworkers, on_error, progress, executor,
                                target, probed)
            _publish(tmp, target, attrs, overwrite)
        except BaseException:
            discard(tmp)
            raise
        return open_store(target)


def _build_into(
    tmp: Path,
    spec: StoreSpec,
    keys: list[str],
    fn: Loader,
    nworkers: int,
    on_error: str,
    progress: bool,
    executor: Executor | None,
    target: Path,
    probed: tuple[int, npt.NDArray[Any]] | None = None,
) -> dict[str, Any]:
    """Write shards, index and array metadata into ``tmp``; return the group attributes.

    ``probed`` is ``(row, value)`` of an item computed already (to learn the item shape).
    """
    n, s = spec.n, spec.rows_per_shard
    if n and spec.item_shape == (0,):
        every = [(k, "the loader failed on every source") for k in keys]
        raise BuildError(_failure_message(every, n, target), every)
    io_step("mkdir")
    (tmp / VECTORS).mkdir()
    tasks = [
        ShardTask(str(tmp), shard_key(spec, k), keys[k * s : (k + 1) * s], fn, spec.dtype,
                  spec.item_shape, s, on_error == "skip")
        for k in range(math.ceil(n / s))
    ]
    if probed is not None:
        row, value = probed
        tasks[row // s].computed[row % s] = value
    results = run_tasks(tasks, nworkers, progress, executor, target, n)
    remove_partials(tmp / VECTORS)  # left by attempts killed mid-write, then retried
    failures: list[tuple[int, str, str]] = []
    sizes = np.empty(n, dtype=np.int64)
    mtimes = np.empty(n, dtype=np.int64)
    for k, task in enumerate(tasks):
        res = results[task.rel]
        base = k * s
        failures.extend((base + i, reason, frames) for i, reason, frames in res.failures)
        sizes[base : base + len(task.keys)] = res.source_size
        mtimes[base : base + len(task.keys)] = res.source_mtime_ns
    failures.sort()
    if failures and on_error == "raise":
        named = [(keys[i], reason) for i, reason, _frames in failures]
        frames = [f for _i, _reason, f in failures]
        raise BuildError(_failure_message(named, n, target, frames), named)
    if failures:
        keep = np.ones(n, dtype=bool)
        keep[[i for i, _r, _f in failures]] = False
        old_rows = [len(t.keys) for t in tasks]
        spec, files = _drop_failed_rows(tmp, spec, old_rows, keep)
        skipped = tuple((keys[i], reason) for i, reason, _frames in failures)
        spec = dataclasses.replace(spec, skipped=skipped)
        keys = [k for k, ok in zip(keys, keep.tolist(), strict=True) if ok]
        sizes, mtimes = sizes[keep], mtimes[keep]
    else:
        files = {t.rel: [results[t.rel].size, results[t.rel].checksum] for t in tasks}
    return finish_store(tmp, spec, files, keys, sizes, mtimes)


def _failure_message(
    failures: list[tuple[str, str]], n: int, target: Path, frames: list[str] | None = None
) -> str:
    """Say which sources failed and why, with the loader's last frames of each failure."""
    lines = []
    before = ""
    for k, (p, r) in enumerate(failures[:10]):
        lines.append(f"  {p}: {r}")
        where = frames[k] if frames is not None else ""
        if where and where == before:
            lines.append("      (raised at the same place as above)")
        elif where:
            lines.append(textwrap.indent(where, "    "))
        before = where
    shown = "\n".join(lines)
    more = f"\n  ... and {len(failures) - 10} more (see .failures)" if len(failures) > 10 else ""
    return (
        f"{len(failures)} of {n} sources could not be loaded, so {str(target)!r} was not "
        f"built:\n{shown}{more}\nFix or remove them, or pass on_error='skip' to build the rest."
    )


def _publish(tmp: Path, target: Path, attrs: dict[str, Any], overwrite: bool) -> None:
    """Write the group metadata last, then publish ``tmp`` as ``target`` with one rename."""
    group = {"attributes": {ATTR_KEY: attrs}, "zarr_format": 3, "node_type": "group"}
    write_json_durable(tmp / "zarr.json", group)
    fsync_dir(tmp)
    try:  # publish only what readers accept (e.g. not metadata past their size caps)
        parse_group(tmp)
    except CorruptStoreError as exc:
        raise BuildError(
            f"the finished store fails the checks every reader applies, so nothing was "
            f"published at {str(target)!r}: {exc}"
        ) from exc
    old: Path | None = None
    if overwrite and (target.exists() or target.is_symlink()):
        # one atomic swap where the system has it: readers see the old or the new store
        io_step("rename")
        if exchange_dirs(tmp, target):
            fsync_dir(target.parent)
            if tmp.is_symlink():
                tmp.unlink()
            shutil.rmtree(tmp, ignore_errors=True)
            return
        # named like a build directory, so collect_debris removes it if we die here
        old = tmp.with_name(tmp.name + ".old")
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
        shutil.rmtree(old, ignore_errors=True)
