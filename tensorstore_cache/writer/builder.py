"""Building a store: decode in worker processes, write shards, publish atomically.

The coordinator plans the rows into shards (:mod:`.plan`, which probes the
loader when nothing says what it returns), hands whole shards to workers
(never two writers in one shard) and assembles the store (:mod:`.execute`),
then writes the group metadata and publishes the finished directory with a
single ``rename``. Everything before the rename happens in a hidden sibling
directory, so a failed or killed build leaves nothing at the target. A batch
loader's build has its device workers started first and stopped last
(:mod:`.device`).

A build to an fsspec URL (:func:`build_to_url`) has its tasks upload the
shards they write; the coordinator assembles the index and the metadata in a
staging directory of the node cache, uploads them with the group
``zarr.json`` last, and keeps that directory as this node's copy. A store of
records is built the same way; its tasks also upload the runs of its ragged
fields (``runs/<field>/<k>``), which the coordinator downloads one batch at a
time, checks, assembles into chunks, uploads with the index and deletes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import StoreExistsError
from ..fs import collect_temps, make_dir, remove_tree, temp_path
from ..remote import (
    discard_upload,
    shared_between_processes,
    staging_dir,
    upload_store,
    withdraw_store,
)
from .assemble import publish, seal
from .device import devices_for
from .execute import Upload, execute
from .options import BuildOptions
from .plan import plan
from .reentry import building
from .tasks import RUNS

__all__ = [
    "build",
    "build_to_url",
    "collect_debris",
    "default_workers",
    "temp_dir",
]


def default_workers() -> int:
    """Return the number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def temp_dir(target: Path) -> Path:
    """Return a fresh hidden build directory next to ``target`` (not created)."""
    return temp_path(target, "build")


def collect_debris(out: Path, max_age_s: float = 24 * 3600.0, *, any_owner: bool = False) -> None:
    """Remove the temporary entries of ``out`` left by dead processes (build directories and
    what was being created or removed beside it; the current user's only, unless ``any_owner``)."""
    collect_temps(out.parent, max_age_s, target=out.name, any_owner=any_owner)


def _workers(options: BuildOptions) -> int:
    """The build's worker processes (``options.workers``, or every core).

    Raises
    ------
    ValueError
        If ``options.workers`` is less than 1.
    """
    nworkers = default_workers() if options.workers is None else int(options.workers)
    if nworkers < 1:
        raise ValueError(f"workers must be at least 1, got {options.workers!r}")
    return nworkers


def build(
    keys: list[str], target: Path, options: BuildOptions
) -> npt.NDArray[np.uint64] | None:
    """Build the store of ``keys`` at ``target`` and publish it atomically.

    Parameters
    ----------
    keys
        Distinct normalised keys, in row order.
    target
        The store directory to create (replaced with ``options.overwrite``).
    options
        How to build.

    Returns
    -------
    numpy.ndarray or None
        The content hashes of the published rows' sources, in row order (0:
        none taken), None if none was taken. They are not part of the store:
        a cache keeps them beside its part (see
        :mod:`tensorstore_cache.format.hashes`).

    Raises
    ------
    BuildError
        If sources failed and ``options.on_error == "raise"``.
    StoreExistsError
        If ``target`` exists and ``options.overwrite`` is false.
    """
    with building(target):  # a loader or worker asking for this build fails at once
        if (target.exists() or target.is_symlink()) and not options.overwrite:
            raise StoreExistsError(
                f"{str(target)!r} already exists; pass overwrite=True to replace it, or open it "
                "with tensorstore_cache.open_store"
            )
        nworkers = _workers(options)
        with devices_for(options, keys, nworkers) as started:
            planned = plan(keys, options, str(target), nworkers, started)
            target.parent.mkdir(parents=True, exist_ok=True)
            collect_debris(target)
            tmp = temp_dir(target)
            make_dir(tmp, options.trust, exist_ok=False)
            try:
                meta, _sent, hashes = execute(tmp, planned)
                publish(tmp, target, meta, overwrite=options.overwrite, trust=options.trust)
            except BaseException:
                remove_tree(tmp)
                raise
    return hashes if bool(np.any(hashes != 0)) else None


def build_to_url(
    keys: list[str],
    url: str,
    options: BuildOptions,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[npt.NDArray[np.uint64] | None, Path]:
    """Build the store of ``keys`` at the fsspec URL ``url``, its shards uploaded by their tasks.

    Each shard task writes its shard to a local temporary file and uploads it
    from the process (or machine) that runs it. This process then writes the
    index and the metadata into a staging directory of the node cache,
    uploads them, the group ``zarr.json`` last, and keeps the directory as
    this node's copy of the new version (its shards are fetched when first
    read). With ``options.overwrite`` the old group ``zarr.json`` is
    deleted before the first shard is sent (shards are replaced in place),
    so the old store is gone from ``url`` from then on, also if the build
    fails. A build that fails deletes the files it sent, and never writes a
    group ``zarr.json``; a task still running on a given executor then may
    upload its shard afterwards, which no reader sees and the next build
    there deletes. A ``memory://`` URL, which only this process sees,
    has its shards written into the staging directory and uploaded from here.

    A store of records: the tasks upload the shards of its fixed fields, and
    the values of its ragged and text fields as runs (``runs/<field>/<k>``);
    this process downloads the runs (each checked against the size and
    XXH3-128 its task reported), writes the chunks, offsets and shapes,
    uploads them with the index, and deletes the runs.

    Returns
    -------
    tuple
        The content hashes of the rows' sources, as :func:`build` returns
        them, and this node's copy of the store (its version's directory in
        the node cache).

    Raises
    ------
    BuildError
        If sources failed and ``options.on_error == "raise"``.
    """
    staging = staging_dir(url, cache_dir, trust=options.trust)
    local = staging / "store"
    options_dict = dict(storage_options) if storage_options is not None else None
    upload = (Upload(url, options_dict) if shared_between_processes(url, storage_options)
              else None)
    try:
        nworkers = _workers(options)
        with building(local), devices_for(options, keys, nworkers) as started:
            planned = plan(keys, options, url, nworkers, started)
            make_dir(local, options.trust, exist_ok=False)
            if options.overwrite:
                withdraw_store(url, storage_options=storage_options)
            try:
                meta, sent, hashes = execute(local, planned, upload)
                seal(local, meta, url, options.trust)
                copy = upload_store(local, url, uploaded=sent, overwrite=options.overwrite,
                                    cache_dir=cache_dir, storage_options=storage_options,
                                    trust=options.trust, scratch=(RUNS,))
            except BaseException as exc:
                try:
                    discard_upload(url, storage_options=storage_options, scratch=(RUNS,))
                except Exception as cleanup:
                    exc.add_note(
                        f"the files this build uploaded to {url!r} could not all be deleted "
                        f"({type(cleanup).__name__}: {cleanup}); no group zarr.json names them, "
                        "so no reader sees them, and the next build there replaces them"
                    )
                raise
    finally:
        remove_tree(staging)
    return (hashes if bool(np.any(hashes != 0)) else None), copy
