"""One phase of one method, in a process of its own: ``python -m ... JOB.json``.

The job file (written by :mod:`benchmarks.records`) names the phase, the method, the
store directory, the inputs and where to write the result (JSON). Phases:

``build``
    write the store from the inputs (or synthetic records) with 2 workers; time it.
``read``
    open the store and read its first record (open time), map the keys, then the
    digests of the records read by key and of the first batches (checked against the
    numpy limit's by the driver), records by key per second, the time of every random
    batch of 256 padded records, and a sequential epoch in padded batches of 256.
``open``
    open and read the first record only (open time versus N, fresh processes).
``hold``
    read the keys, open, map, read every record once (in batches of 64, so that the
    pass itself leaves little behind), then write the ``ready`` file (with the names of
    the modules loaded) and wait for the ``release`` file: the driver reads this
    process's memory meanwhile.
``baseline``
    import the modules a reader had loaded (the job's ``modules``: libraries import
    parts of themselves lazily, at the first open) and read the keys, then as ``hold``:
    the memory every reader has without any store.
``cleanup``
    :meth:`RecordMethod.cleanup` (shared memory left by MosaicML streaming).

The result holds ``status``: ``ok``, ``error`` (with the traceback) or ``not installed``
(a library of the method does not import here: the reason). Imports are not timed.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common._disk import dir_bytes
from benchmarks.records import records_data
from benchmarks.records.records_methods import get
from benchmarks.records.records_methods._base import Batch, Reader, RecordMethod

DIGEST_BATCHES = 16
DIGEST_RECORDS = 64
HOLD_BATCH = 64
RELEASE_POLL_S = 0.05


def _versions(packages: Iterable[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _source(job: Mapping[str, Any]) -> tuple[list[str], Callable[[str], dict[str, Any]]]:
    if job.get("synthetic"):
        return records_data.synthetic_keys(int(job["synthetic"])), records_data.SyntheticRecords()
    return records_data.read_keys(job["inputs"]), records_data.RecordLoader(job["inputs"])


def _update(h: Any, image: Any, title_ids: Any, rating: Any) -> None:
    ids = np.ascontiguousarray(title_ids, dtype=np.int32)
    h.update(np.ascontiguousarray(image, dtype=np.uint8).tobytes())
    h.update(np.asarray(ids.shape, dtype=np.int64).tobytes())
    h.update(ids.tobytes())
    h.update(np.ascontiguousarray(rating, dtype=np.float32).tobytes())


def batch_digest(batches: Iterable[Batch]) -> str:
    """SHA-256 of the batches' values, the padded shape included."""
    h = hashlib.sha256()
    for b in batches:
        _update(h, b.image, b.title_ids, b.rating)
    return h.hexdigest()


def record_digest(records: Iterable[Mapping[str, Any]]) -> str:
    """SHA-256 of the records' fields."""
    h = hashlib.sha256()
    for r in records:
        _update(h, r["image"], r["title_ids"], r["rating"])
    return h.hexdigest()


def consume(batches: Iterable[Batch]) -> dict[str, Any]:
    """Read every value of every batch; sums that the driver compares across methods."""
    count = image = titles = width = 0
    rating = 0.0
    for b in batches:
        count += len(b.image)
        image += int(np.add.reduce(b.image.reshape(-1), dtype=np.uint64))
        titles += int(np.add.reduce(b.title_ids.reshape(-1), dtype=np.int64))
        width += int(b.title_ids.shape[1])
        rating += float(np.add.reduce(b.rating, dtype=np.float64))
    return {"records": count, "image_sum": image, "title_sum": titles, "width_sum": width,
            "rating_sum": round(rating, 3)}


def _open(method: RecordMethod, job: Mapping[str, Any]) -> tuple[Reader, float]:
    if not job.get("concurrent"):  # readers alive at once: the driver cleaned up before them
        method.before_open()
    # the collection this process's setup (imports, the job) made due is not the method's:
    # without this, whether it lands inside a method's open depends on its imports
    gc.collect()
    t0 = time.perf_counter()
    reader = method.open(Path(job["out"]), job.get("built") or {})
    reader.first()
    return reader, time.perf_counter() - t0


def phase_build(method: RecordMethod, job: Mapping[str, Any]) -> dict[str, Any]:
    keys, loader = _source(job)
    out = Path(job["out"])
    t0 = time.perf_counter()
    built = method.build(keys, out, loader, int(job["workers"]),
                         synthetic=bool(job.get("synthetic")))
    build_s = time.perf_counter() - t0
    return {"build_s": build_s, "built": built, "records": len(keys),
            "disk_bytes": dir_bytes(out)}


def phase_read(method: RecordMethod, job: Mapping[str, Any]) -> dict[str, Any]:
    keys, _ = _source(job)
    batches = np.load(job["batches"])
    lookups = [keys[i] for i in np.load(job["lookups"]).tolist()]
    reader, open_s = _open(method, job)
    t0 = time.perf_counter()
    reader.key_map(keys)
    key_map_s = time.perf_counter() - t0
    first = [reader.batch(rows) for rows in batches[:DIGEST_BATCHES]]
    out: dict[str, Any] = {
        "open_s": open_s, "key_map_s": key_map_s, "records": reader.n,
        "batch_digest": batch_digest(first),
        "record_digest": record_digest(reader.record(k) for k in lookups[:DIGEST_RECORDS]),
        "batch_types": {"image": [str(first[0].image.dtype), list(first[0].image.shape)],
                        "title_ids": [str(first[0].title_ids.dtype),
                                      list(first[0].title_ids.shape)],
                        "rating": [str(first[0].rating.dtype), list(first[0].rating.shape)]},
    }
    del first
    budget = float(job["lookup_budget_s"])
    done, t0 = 0, time.perf_counter()
    while True:
        for key in lookups:
            r = reader.record(key)
            _ = (r["image"], r["title_ids"], r["rating"])  # every field, as a user would
        done += len(lookups)
        elapsed = time.perf_counter() - t0
        if elapsed >= budget:
            break
    out["record_by_key_per_s"] = done / elapsed
    times = []
    for rows in batches:
        t0 = time.perf_counter()
        reader.batch(rows)
        times.append(time.perf_counter() - t0)
    t = np.asarray(times)
    out["batch_s"] = {"median": float(np.median(t)), "p10": float(np.percentile(t, 10)),
                      "p90": float(np.percentile(t, 90)), "count": len(t),
                      "batch_size": int(batches.shape[1])}
    out["batch_records_per_s"] = batches.shape[1] / float(np.median(t))
    t0 = time.perf_counter()
    out["epoch"] = consume(reader.epoch(int(job["epoch_batch"])))
    out["epoch_s"] = time.perf_counter() - t0
    reader.close()
    return out


def phase_open(method: RecordMethod, job: Mapping[str, Any]) -> dict[str, Any]:
    reader, open_s = _open(method, job)
    reader.close()
    return {"open_s": open_s}


def _hold(job: Mapping[str, Any]) -> None:
    _write(job["ready"], {"pid": os.getpid(), "modules": sorted(sys.modules)})
    release = Path(job["release"])
    deadline = time.monotonic() + float(job.get("hold_timeout_s", 600))
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(RELEASE_POLL_S)


def phase_hold(method: RecordMethod, job: Mapping[str, Any]) -> dict[str, Any]:
    keys, _ = _source(job)
    reader, open_s = _open(method, job)
    reader.key_map(keys)
    sums = consume(reader.epoch(HOLD_BATCH))
    _hold(job)
    reader.close()
    return {"open_s": open_s, "epoch": sums, "keys": len(keys)}


def phase_baseline(method: RecordMethod, job: Mapping[str, Any]) -> dict[str, Any]:
    missed = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in job.get("modules", []):
            try:
                importlib.import_module(name)
            except BaseException:  # built-in submodules, platform parts: not importable by name
                missed.append(name)
    keys, _ = _source(job)
    _hold(job)
    return {"keys": len(keys), "modules_imported": len(job.get("modules", [])) - len(missed),
            "modules_missed": missed}


def phase_cleanup(method: RecordMethod, job: Mapping[str, Any]) -> dict[str, Any]:
    return method.cleanup()


PHASES = {"build": phase_build, "read": phase_read, "open": phase_open, "hold": phase_hold,
          "baseline": phase_baseline, "cleanup": phase_cleanup}


def _write(path: str, result: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    info = {"python": sys.executable, "pid": os.getpid()}
    method = get(job["method"])
    info["versions"] = _versions(method.packages)
    t0 = time.perf_counter()
    try:
        for module in method.modules:
            importlib.import_module(module)
    except Exception as exc:  # an import that fails for any reason: not installed here
        cause = f"{type(exc).__name__}: {exc}".splitlines()[0]
        _write(job["result"], {**info, "status": "not installed", "cause": cause,
                               "error": traceback.format_exc()})
        return 3
    info["import_s"] = time.perf_counter() - t0
    try:
        result = PHASES[job["phase"]](method, job)
    except BaseException as exc:
        cause = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        _write(job["result"], {**info, "status": "error", "cause": cause,
                               "error": traceback.format_exc()})
        return 1
    _write(job["result"], {**info, "status": "ok", **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
