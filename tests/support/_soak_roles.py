"""The processes of the cache soak test (:mod:`tests.support.soak`): callers, gc, the writer, the final check.

Each role runs in its own process, started by the soak's orchestrator with
``python -m tests.support._soak_roles ROLE JSON`` or as a ``multiprocessing``
target (spawn or fork), and talks to it through files only: records
appended as JSON lines (one ``write`` each, so a process killed mid-record
leaves at most one torn last line), and a stop file. Every role exits when
the stop file appears, at its hard deadline, or as soon as its parent (the
orchestrator) is gone, and dumps its stacks to its log on ``SIGUSR1``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import tensorstore_cache as tsc

from ._soak_sabotage import apply as apply_sabotage
from ._soak_sources import (
    ITEM_LEN,
    SourceLoader,
    decode,
    expected_vector,
    pad_length,
    read_version,
    sid_of,
    source_name,
)
from ._soak_sources import write_source as _write_source

__all__ = ["ROLES", "caller", "final", "gc_loop", "main", "writer"]

_LIBRARY_LOGGER = "tensorstore_cache"
_EXAMPLES = 3  # examples of each kind kept per record
_STALE_KEPT = 50  # stale vectors are rare: each is kept (up to this many per record), to explain
_TRACE_CHARS = 6000


class _Captured(logging.Handler):
    """Keeps the library's log records of the current call (for the records)."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[logging.LogRecord]:
        out, self.records = self.records, []
        return out


def _template(message: str) -> str:
    """A log message with its numbers and namespace names blanked (to count messages by kind)."""
    return re.sub(r"\d+", "N", re.sub(r"\S*-float32-[0-9a-f]+", "<namespace>", message))


def _setup(cfg: dict[str, Any]) -> _Captured:
    """Common start of a role: its log file, stack dumps on SIGUSR1, a parent watch, log capture."""
    fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    parent = int(cfg["parent"])

    def watch() -> None:  # the orchestrator died: nobody will stop this process
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(3)

    threading.Thread(target=watch, name="soak-parent-watch", daemon=True).start()
    apply_sabotage(cfg.get("sabotage"))
    handler = _Captured(logging.INFO)
    logger = logging.getLogger(_LIBRARY_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    print(f"{cfg.get('role')} pid {os.getpid()} started", flush=True)
    return handler


def _stopping(cfg: dict[str, Any]) -> bool:
    return os.path.exists(cfg["stop"]) or time.monotonic() > float(cfg["hard_deadline"])


def _append(path: str, record: dict[str, Any]) -> None:
    """Append one JSON line with a single ``write``."""
    data = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _describe(exc: BaseException, phase: str) -> dict[str, Any]:
    """An exception as a record: its type, its classes, message and traceback."""
    tb = "".join(traceback.format_exception(exc))
    return {
        "phase": phase,
        "type": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "message": str(exc)[:2000],
        "traceback": tb[-_TRACE_CHARS:],
    }


def registry_paths(registry: str) -> list[str]:
    """The source paths written so far (complete lines of the registry)."""
    try:
        with open(registry) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [line for line in text.split("\n")[:-1] if line]


# -- a caller of cached() ---------------------------------------------------------------

def _subset(rng: random.Random, names: list[str], max_subset: int) -> list[str]:
    """A random subset: a few, tens or hundreds of paths, some of the newest first.

    The newest paths come first, so a namespace's first build often probes
    (loads first, to learn the item shape) a source the writer rewrites often.
    """
    r = rng.random()
    k = rng.randint(1, 10) if r < 0.2 else rng.randint(10, 100) if r < 0.6 else rng.randint(100, max_subset)
    newest = names[-rng.randint(1, 3):]
    newest.reverse()
    return list(dict.fromkeys(newest + rng.sample(names, min(k, len(names)))))


def _check(store: tsc.CacheStore, subset: list[str], before: dict[str, int],
           rec: dict[str, Any]) -> None:
    """Check a returned store against the sources; fill ``rec``'s counts and examples."""
    skipped = {p for p, _reason in store.spec.skipped}
    rows = np.asarray(store.rows(subset, missing="ignore"))
    missing = [p for p, r in zip(subset, rows.tolist(), strict=True) if r < 0 and p not in skipped]
    rec["n_missing"] = len(missing)
    rec["missing"] = missing[:_EXAMPLES]
    rec["skipped"] = len(skipped)
    present = [(p, r) for p, r in zip(subset, rows.tolist(), strict=True) if r >= 0]
    if not present:
        return
    vectors = np.asarray(store.take(np.array([r for _p, r in present], np.int64)))
    after = {p: read_version(p) for p, _r in present}
    wrong: list[dict[str, Any]] = []
    stale: list[dict[str, Any]] = []
    n_wrong = n_stale = 0
    for (p, _r), vec in zip(present, vectors, strict=True):
        rec["checked"] += 1
        got = vec.reshape(-1)
        sid, version = int(got[0]), int(got[1])
        ok = (got.shape == (ITEM_LEN,) and sid == sid_of(p) and 0 <= version <= after[p]
              and bool(np.array_equal(got, expected_vector(sid, version))))
        if not ok:
            n_wrong += 1
            if len(wrong) < _EXAMPLES:
                wrong.append({"path": p, "vector": got.tolist(), "on_disk_before": before[p],
                              "on_disk_after": after[p]})
        elif version < before[p]:
            n_stale += 1
            if len(stale) < _STALE_KEPT:
                stale.append({"path": p, "returned_version": version,
                              "on_disk_at_start": before[p], "on_disk_after": after[p]})
    rec.update(n_wrong=n_wrong, wrong=wrong, n_stale=n_stale, stale=stale)


def caller(cfg: dict[str, Any]) -> None:
    """Call ``cached()`` on random subsets until told to stop; record every call."""
    captured = _setup(cfg)
    rng = random.Random(f"{cfg['seed']}-{os.getpid()}")
    loader = SourceLoader(delay=float(cfg["delay"]))
    while not _stopping(cfg):
        names = registry_paths(cfg["registry"])
        subset = _subset(rng, names, int(cfg["max_subset"]))
        lid = rng.choice(cfg["loader_ids"])
        before = {p: read_version(p) for p in subset}
        rec: dict[str, Any] = {
            "pid": os.getpid(), "caller": cfg["i"], "lid": lid, "n": len(subset),
            "workers": cfg["workers"], "checked": 0, "n_missing": 0, "n_wrong": 0, "n_stale": 0,
            "error": None, "t0": time.monotonic(),
        }
        captured.take()
        try:
            store = tsc.cached(subset, loader=loader, loader_id=lid, cache_dir=cfg["cache"],
                               workers=int(cfg["workers"]), progress=False)
        except Exception as exc:
            rec["error"] = _describe(exc, "cached")
        else:
            try:
                _check(store, subset, before, rec)
            except Exception as exc:
                rec["error"] = _describe(exc, "check")
            finally:
                store.close()
        rec["t1"] = time.monotonic()
        rec["log"] = dict(Counter(_template(str(r.msg)) for r in captured.take()))
        _append(cfg["records"], rec)


# -- gc in a loop ------------------------------------------------------------------------

def gc_loop(cfg: dict[str, Any]) -> None:
    """Run ``gc(older_than=0)`` and ``gc(max_bytes=...)`` in turn until told to stop."""
    captured = _setup(cfg)
    rng = random.Random(f"{cfg['seed']}-{os.getpid()}")
    k = 0
    while not _stopping(cfg):
        mode = "older_than=0" if k % 2 == 0 else f"max_bytes={cfg['max_bytes']}"
        k += 1
        rec: dict[str, Any] = {"pid": os.getpid(), "mode": mode, "t0": time.monotonic(),
                               "error": None, "removed": {}}
        captured.take()
        try:
            if k % 2:
                removed = tsc.gc(cfg["cache"], older_than=0)
            else:
                removed = tsc.gc(cfg["cache"], max_bytes=int(cfg["max_bytes"]))
            rec["removed"] = dict(Counter(f"{mode.split('=')[0]}:{r.kind}" for r in removed))
        except Exception as exc:
            rec["error"] = _describe(exc, "gc")
        rec["t1"] = time.monotonic()
        rec["warnings"] = [r.getMessage()[:1000] for r in captured.take()
                           if r.levelno >= logging.WARNING]
        _append(cfg["records"], rec)
        calm = rng.random() < float(cfg["p_calm"])  # a while without gc: namespaces grow, merge
        time.sleep(rng.uniform(0.5, 2.0) if calm else rng.uniform(0, float(cfg["pause"])))


# -- the writer ---------------------------------------------------------------------------

def writer(cfg: dict[str, Any]) -> None:
    """Rewrite sources (versions only go up) and add new ones until told to stop.

    Each rewrite is atomic. Most keep the file's size; some are a burst of
    two versions, the second of the same size and, when it comes within
    ``same_tick_ns`` of the first, with the first one's modification time
    (what a filesystem with coarse timestamps does to two writes in one
    tick). The newest sources, which every call asks for, are rewritten most.
    """
    _setup(cfg)
    rng = random.Random(f"{cfg['seed']}-writer")
    src = Path(cfg["src"])
    paths = registry_paths(cfg["registry"])
    versions: dict[int, int] = {}
    pads: dict[int, int] = {}
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        sid, version = decode(data, p)
        versions[sid], pads[sid] = version, pad_length(data)
    next_sid = max(versions, default=-1) + 1
    counts = Counter[str]()
    interval = float(cfg["interval"])
    next_new = time.monotonic() + float(cfg["new_every"])
    window = int(cfg["same_tick_ns"])
    journal = cfg["journal"]  # "sid version size mtime_ns same_tick" of every write
    try:
        while not _stopping(cfg):
            if time.monotonic() >= next_new:
                next_new += float(cfg["new_every"])
                sid = next_sid
                next_sid += 1
                versions[sid], pads[sid] = 0, rng.randint(8, 40)
                st = _write_source(src, sid, 0, pads[sid])
                _append_line(journal, f"{sid} 0 {st.st_size} {st.st_mtime_ns} 0")
                _append_line(cfg["registry"], str(src / source_name(sid)))  # listed once it exists
                counts["created"] += 1
                continue
            # the newest sources (every call asks for some) are rewritten most often
            hot = rng.random() < float(cfg["p_newest"])
            sid = next_sid - rng.randint(1, 3) if hot and next_sid > 3 else rng.choice(list(versions))
            if rng.random() >= float(cfg["p_same_size"]):
                pads[sid] = rng.randint(8, 40)
                counts["size_changed"] += 1
            versions[sid] += 1
            st = _write_source(src, sid, versions[sid], pads[sid])
            _append_line(journal, f"{sid} {versions[sid]} {st.st_size} {st.st_mtime_ns} 0")
            counts["rewrites"] += 1
            if rng.random() < float(cfg["p_burst"]):
                versions[sid] += 1
                if window:  # within one simulated timestamp tick of the first write
                    time.sleep(rng.uniform(0, window / 2e9))
                same_tick = window > 0 and time.time_ns() - st.st_mtime_ns < window * 3 // 4
                st2 = _write_source(src, sid, versions[sid], pads[sid],
                                    mtime_ns=st.st_mtime_ns if same_tick else None)
                _append_line(journal, f"{sid} {versions[sid]} {st2.st_size} {st2.st_mtime_ns} "
                                      f"{int(same_tick)}")
                counts["rewrites"] += 1
                counts["same_tick" if same_tick else "bursts"] += 1
            time.sleep(rng.uniform(0, 2 * interval))
    finally:
        counts["sources"] = len(versions)
        counts["max_version"] = max(versions.values(), default=0)
        tmp = cfg["stats"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(dict(counts), f)
        os.replace(tmp, cfg["stats"])


def _append_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


# -- the final check -----------------------------------------------------------------------

def final(cfg: dict[str, Any]) -> None:
    """After everything stopped: gc, a fresh ``cached()`` of every source, verify, gc again."""
    _setup(cfg)
    out: dict[str, Any] = {"checked": 0, "wrong": [], "n_wrong": 0, "missing": [], "n_missing": 0,
                           "verify": [], "error": None}
    try:
        tsc.gc(cfg["cache"], grace=0)
        paths = registry_paths(cfg["registry"])
        latest = {p: read_version(p) for p in paths}
        loader = SourceLoader()
        for lid in cfg["loader_ids"]:
            with tsc.cached(paths, loader=loader, loader_id=lid, cache_dir=cfg["cache"],
                            workers=2, progress=False) as store:
                rows = np.asarray(store.rows(paths, missing="ignore"))
                skipped = {p for p, _r in store.spec.skipped}
                miss = [p for p, r in zip(paths, rows.tolist(), strict=True)
                        if r < 0 and p not in skipped]
                out["n_missing"] += len(miss)
                out["missing"] += miss[:_EXAMPLES]
                ok_rows = [(p, r) for p, r in zip(paths, rows.tolist(), strict=True) if r >= 0]
                vectors = np.asarray(store.take(np.array([r for _p, r in ok_rows], np.int64)))
                for (p, _r), vec in zip(ok_rows, vectors, strict=True):
                    out["checked"] += 1
                    want = expected_vector(sid_of(p), latest[p])
                    if not np.array_equal(vec.reshape(-1), want):
                        out["n_wrong"] += 1
                        if len(out["wrong"]) < 10:
                            out["wrong"].append({"loader_id": lid, "path": p,
                                                 "vector": vec.reshape(-1).tolist(),
                                                 "on_disk": latest[p]})
                report = tsc.verify_store(store)
                if not report.ok:
                    out["verify"].append({"loader_id": lid, "problems": [str(x) for x in
                                                                         report.problems[:10]]})
        tsc.gc(cfg["cache"], grace=0)
    except Exception as exc:
        out["error"] = _describe(exc, "final")
    tmp = cfg["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, cfg["out"])


ROLES = {"caller": caller, "gc": gc_loop, "writer": writer, "final": final}


def run_role(cfg: dict[str, Any]) -> None:
    """Run the role ``cfg["role"]`` (a ``multiprocessing`` target)."""
    ROLES[cfg["role"]](cfg)


def main(argv: list[str]) -> int:
    """``python -m tests.support._soak_roles ROLE JSON``."""
    role, cfg = argv[0], json.loads(argv[1])
    cfg["role"] = role
    ROLES[role](cfg)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
