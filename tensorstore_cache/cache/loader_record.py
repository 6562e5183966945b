"""What a namespace's automatically named loader was made of, kept beside its parts.

A loader given to :func:`~tensorstore_cache.cached` without a ``loader_id`` is
named by its fingerprint (:mod:`tensorstore_cache.identity`). Its components,
the library versions and the bytecode tag are written to ``loader.json`` in the
namespace, once: not part of the namespace's identity (``namespace.json``,
which other machines compare), but what explains it. From it:

* a loader whose name already has a namespace and gets a new one is told in
  one line why ("helper `resize_to` changed");
* a name that got three new namespaces within a day, the same component
  moving each time, is warned about
  (:class:`~tensorstore_cache.LoaderFingerprintWarning`), naming that
  component: per-run state such as a global ``uuid4()`` (or edits of it);
* a namespace reused under other library versions is reported;
* a loader whose fingerprint changed while it built is warned about.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

from ..errors import (
    CorruptStoreError,
    LoaderFingerprintWarning,
    UnnamedLoaderError,
    UntrustedCacheError,
)
from ..fs import Trust, open_file, parse_json_fd, temp_path, write_json_durable
from ..identity import (
    AUTO_PREFIX,
    LoaderFingerprint,
    distribution_version,
    explain_change,
    moving_components,
)
from .fingerprint import slug

__all__ = ["RECORD", "after_build", "before_build"]

logger = logging.getLogger("tensorstore_cache")

#: The file beside ``namespace.json`` describing an automatically named loader.
RECORD = "loader.json"
_DAY_S = 24 * 3600
_PER_DAY = 3  # new namespaces for one loader name within a day that mean per-run state
_MAX_BYTES = 4 << 20


def _read(root: Path, trust: Trust) -> dict[str, Any] | None:
    path = root / RECORD
    try:
        fd = open_file(path, trust)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        found = parse_json_fd(fd, path, max_bytes=_MAX_BYTES)
    except CorruptStoreError as exc:
        logger.warning("ignoring %s: %s", path, exc)
        return None
    ok = isinstance(found.get("loader_id"), str) and isinstance(found.get("components"), list)
    return found if ok else None


def _siblings(cache_dir: Path, root: Path, fp: LoaderFingerprint,
              trust: Trust) -> list[dict[str, Any]]:
    """The records of the other namespaces named after the same loader, newest first."""
    prefix = slug(f"{AUTO_PREFIX}{fp.name}/")[:30]  # cut before the digest
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(cache_dir):
            if entry.name.startswith(prefix) and entry.name != root.name and entry.is_dir():
                with contextlib.suppress(OSError):  # another user's, or removed meanwhile
                    record = _read(Path(entry.path), trust)
                    if record is not None and record["loader_id"].startswith(
                            f"{AUTO_PREFIX}{fp.name}/"):
                        found.append(record)
    return sorted(found, key=lambda r: float(r.get("created", 0)), reverse=True)


def before_build(cache_dir: Path, root: Path, fp: LoaderFingerprint, trust: Trust) -> bool:
    """Report on the namespace ``root`` of ``fp`` before it is used; whether it is new.

    New (no record yet): one line saying what changed since the newest other
    namespace of the same loader name, and a warning if the name got
    :data:`_PER_DAY` new namespaces within a day, one component moving in each
    (per-run state). Known: the libraries whose
    versions differ from those it was built under.
    """
    try:
        record = _read(root, trust)
    except UntrustedCacheError:
        raise
    except OSError:
        record = None
    if record is not None:
        _report_versions(root, record)
        return False
    others = _siblings(cache_dir, root, fp, trust)
    if others:
        why = explain_change(others[0]["components"], fp.components,
                             str(others[0].get("python", "")), fp.python)
        logger.warning("tensorstore_cache: a new cache namespace for the loader %r: %s",
                       fp.name, why)
    recent = [r for r in others if time.time() - float(r.get("created", 0)) < _DAY_S]
    moving = moving_components([r["components"] for r in recent] + [
        [[c.path, c.origin, c.digest, c.nbytes] for c in fp.components]])
    if len(recent) >= _PER_DAY - 1 and moving:  # one component moved each time: not edits
        warnings.warn(
            f"the loader {fp.name!r} has had {len(recent) + 1} new cache namespaces within a "
            f"day, each because {', '.join(moving[:3])} changed: if its fingerprint depends on "
            "state made anew in each run (a global uuid4() or time()), keep that value out of "
            "the loader or give it a loader_id; if you edited it each time, nothing is wrong",
            LoaderFingerprintWarning, stacklevel=4)
    return True


def _report_versions(root: Path, record: dict[str, Any]) -> None:
    recorded = record.get("versions")
    if not isinstance(recorded, dict):
        return
    moved = []
    for dist, version in sorted(recorded.items()):
        now = distribution_version(str(dist))
        if now is not None and now[1] != version:
            moved.append(f"{dist} {now[1]} (built under {version})")
    if moved:
        logger.warning("tensorstore_cache: reusing %s, built under other library versions: %s",
                       root.name, ", ".join(moved))


def after_build(root: Path, fp: LoaderFingerprint, new: bool, trust: Trust) -> None:
    """Record ``fp`` in a new namespace; warn if the loader's fingerprint moved meanwhile."""
    if not new:
        return
    if root.is_dir():
        record = {**fp.to_json(), "created": time.time()}
        tmp = temp_path(root / RECORD, "new")
        with contextlib.suppress(OSError):
            write_json_durable(tmp, record, trust=trust)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, root / RECORD)  # the first process's record stays
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    try:
        now = fp.retake() if fp.retake is not None else fp
    except UnnamedLoaderError as exc:
        now_said = f"it can no longer be named ({exc.path})"
    else:
        if now.fingerprint == fp.fingerprint:
            return
        now_said = explain_change(fp.components, now.components)
    warnings.warn(
        f"the loader {fp.name!r} changed while it computed ({now_said}): the next call names "
        "it differently and computes everything again; keep state its calls change out of "
        "its attributes, or give it a loader_id", LoaderFingerprintWarning, stacklevel=3)
