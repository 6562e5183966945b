"""The first read in a fresh process: ``open_store``, the first ``take`` and the first record
by key, timed beside the numpy limit's, and the first take profiled.

Run ``python -m benchmarks.cold.first_read [--sizes 5000 80000] [--rounds R] [--profile]``. It
builds, once per size, a store of synthetic records (the records benchmark's fields) and a
store of one tensor per key (``identity="none"``, 2 workers), and the numpy limit of each (the
records benchmark's: memmaps of values and offsets written by hand, a key dict; for tensors, one
``.npy`` of every tensor and a key list). Then, round after round (every store once a round,
interleaved), it starts a fresh ``python`` for each that imports the library (or numpy) and
reports the medians of the rounds, wall and CPU milliseconds, of: opening, the first take of
one row (the limit: one fancy index per field), the two together (what the records benchmark
times as "open") and the first record by key (the limit: its key dict built, then a lookup);
then tensorstore_cache's open + first take over the limit's (CPU: what a shared machine does
not stretch). With ``--instructions``, the instructions of opening and of the first take too
(valgrind's callgrind, each part alone, in a fresh process), with ``--stages`` those of its
stages (:data:`STAGES`), and with ``--profile``, the ``cProfile`` of that first take
(cumulative, top 15) in one more process per store. What is printed is written, with every
round's figures, to ``benchmarks/results/cold/first-read.json`` and ``.md``, stamped with the
run (``--results DIR``, ``--out NAME`` write them elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import tensorstore_cache as tsc
from benchmarks.common._record import Record, add_results_options
from benchmarks.records.records_data import SyntheticRecords, synthetic_keys
from benchmarks.records.records_methods.numpy_limit import METHOD as RECORDS_LIMIT
from benchmarks.records.records_methods.tsc import fields as record_fields

_CHILD = r"""
# nothing a reader would not import is imported before the timed steps: a module imported
# before them (cProfile, pstats) moves the garbage collector's next collection, which then
# lands inside the open (seen as the open's CPU time falling back with the collector off)
import sys, time
import numpy as np
kind, root, key, profile = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
counted = sys.argv[5] if len(sys.argv) > 5 else ""  # "open", "take" or a stage: in a callback
if counted and counted not in ("open", "take"):  # a stage: its function runs in a callback
    import ctypes, importlib
    module, name = counted.split(":")
    owner = importlib.import_module(module)
    *path, attr = name.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, attr)
    def staged(*args, **kwargs):
        box = []
        ctypes.CFUNCTYPE(None)(lambda: box.append(real(*args, **kwargs)))()
        return box[0]
    setattr(owner, attr, staged)
if kind == "tsc":
    import tensorstore_cache as tsc
    def open_(): return tsc.open_store(root)
    def take(store): return store.take(np.zeros(1, dtype=np.int64))
    def by_key(store): return store[key]
elif kind == "records-limit":
    from pathlib import Path
    from benchmarks.records.records_methods.numpy_limit import LimitReader
    def open_(): return LimitReader(Path(root))
    def take(reader): return reader.first()
    def by_key(reader):
        reader.key_map([key])
        return reader.record(key)
else:  # tensors-limit
    def open_(): return np.load(f"{root}/tensors.npy", mmap_mode="r")
    def take(array): return array[np.zeros(1, dtype=np.int64)]
    def by_key(array):
        with open(f"{root}/keys.txt", encoding="utf-8") as f:
            index = {k: i for i, k in enumerate(f.read().splitlines())}
        return array[index[key]]
if counted:  # valgrind --toggle-collect=closure_fcn counts what runs in a ctypes callback
    import ctypes
    def inside(fn, *args):
        box = []
        ctypes.CFUNCTYPE(None)(lambda: box.append(fn(*args)))()
        return box[0]
    store = inside(open_) if counted == "open" else open_()
    inside(take, store) if counted == "take" else take(store)
    sys.exit(0)
clock = time.perf_counter, time.process_time
import gc
gc.collect()  # the collection the imports made due is not the open's (as every benchmark)
t0 = [c() for c in clock]
store = open_()
t1 = [c() for c in clock]
prof = None
if profile:
    import cProfile
    prof = cProfile.Profile()
if prof: prof.enable()
take(store)
if prof: prof.disable()
t2 = [c() for c in clock]
by_key(store)
t3 = [c() for c in clock]
out = {}
for i, unit in enumerate(("ms", "cpu_ms")):
    out[f"open_{unit}"] = 1e3 * (t1[i] - t0[i])
    out[f"first_take_{unit}"] = 1e3 * (t2[i] - t1[i])
    out[f"open_first_{unit}"] = 1e3 * (t2[i] - t0[i])
    out[f"first_key_{unit}"] = 1e3 * (t3[i] - t2[i])
import json
if prof:
    import io, pstats
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(15)
    out["profile"] = text.getvalue()
print(json.dumps(out))
"""

REPO = Path(__file__).resolve().parents[2]


def _tensor(key: str) -> Any:
    return np.full((3, 32, 32), int(key.rsplit("/", 1)[-1]) % 251, np.uint8)


def build(work: Path, n: int) -> dict[str, tuple[str, Path]]:
    """The stores of ``n`` synthetic keys (records and tensors, and their numpy limits),
    built once: name -> (the child's kind, its directory)."""
    keys = synthetic_keys(n)
    stores = {"records": ("tsc", work / f"records-{n}.tsc"),
              "records, numpy limit": ("records-limit", work / f"records-limit-{n}"),
              "tensors": ("tsc", work / f"tensors-{n}.tsc"),
              "tensors, numpy limit": ("tensors-limit", work / f"tensors-limit-{n}")}
    if not stores["records"][1].exists():
        tsc.build_store(keys, stores["records"][1], loader=SyntheticRecords(),
                        loader_id="cold/1", fields=record_fields(), workers=2, progress=False,
                        identity="none").close()
    if not stores["tensors"][1].exists():
        tsc.build_store(keys, stores["tensors"][1], loader=_tensor, loader_id="cold-t/1",
                        workers=2, progress=False, identity="none").close()
    limit = stores["records, numpy limit"][1]
    if not (limit / "keys.txt").exists():
        RECORDS_LIMIT.build(keys, limit, SyntheticRecords(), 2, synthetic=True)
    limit = stores["tensors, numpy limit"][1]
    if not (limit / "keys.txt").exists():
        limit.mkdir(parents=True, exist_ok=True)
        out = np.lib.format.open_memmap(limit / "tensors.npy", mode="w+", dtype=np.uint8,
                                        shape=(n, 3, 32, 32))
        for i, k in enumerate(keys):
            out[i] = _tensor(k)
        out.flush()
        del out
        (limit / "keys.txt").write_text("".join(k + "\n" for k in keys), encoding="utf-8")
    return stores


def measure(kind: str, root: Path, key: str, profile: bool = False) -> dict[str, Any]:
    """One fresh process's open, first take and first record by key of ``root``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", _CHILD, kind, str(root), key,
                           "1" if profile else "0"],
                          capture_output=True, text=True, check=True, timeout=300, env=env)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


#: The stages of opening and of the first take counted by ``--stages``: each function,
#: with what it calls (what is left of opening is its count less theirs).
STAGES = {
    "metadata: group and array zarr.json read and checked":
        "tensorstore_cache.format.metadata:GroupMetadata.read",
    "key index mapped": "tensorstore_cache.reader.segment:Segment._open",
    "first take: shards and chunks mapped": "tensorstore_cache.reader.mapped:MappedArray._map_files",
    "first take": "tensorstore_cache.reader.gather:take",
}


def count(kind: str, root: Path, key: str, part: str) -> int:
    """Instructions of ``part`` (``open``, ``take``, or a function ``module:qualname``) of a
    fresh process's open and first take, counted alone by callgrind (it runs in a ctypes
    callback, ``--toggle-collect=closure_fcn``): what a loaded machine does not change, where
    its milliseconds vary."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--toggle-collect=closure_fcn",
         "--callgrind-out-file=/dev/null", sys.executable, "-c", _CHILD, kind, str(root), key,
         "0", part],
        capture_output=True, text=True, check=True, timeout=1800, env=env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind: {done.stderr[-500:]}")
    return int(found.group(1))


def instructions(kind: str, root: Path, key: str) -> dict[str, int]:
    """Instructions of opening and of the first take (:func:`count`)."""
    opened, took = count(kind, root, key, "open"), count(kind, root, key, "take")
    return {"open": opened, "first_take": took, "open_first": opened + took}


def stage_table(stores: dict[tuple[str, int], tuple[str, Path, str]]) -> list[str]:
    """Every store's instructions of each of :data:`STAGES` (a stage's own function's count:
    it includes the stages it calls)."""
    mine = {s: v for s, v in stores.items() if v[0] == "tsc"}
    lines = ["| stage | " + " | ".join(f"{name} @ {n:,}" for name, n in mine) + " |",
             "|---|" + "---:|" * len(mine)]
    for stage, where in {"open + first take": "", **STAGES}.items():
        cells = []
        for kind, root, key in mine.values():
            got = count(kind, root, key, where) if where else instructions(
                kind, root, key)["open_first"]
            cells.append(f"{got / 1e6:.2f}M")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return lines


def instruction_table(stores: dict[tuple[str, int], tuple[str, Path, str]]) -> list[str]:
    """Every store's instructions of opening and of its first take, and over the limit's."""
    got = {s: instructions(kind, root, key) for s, (kind, root, key) in stores.items()}
    lines = ["| store | rows | open | first take | open + first take | over the numpy limit |",
             "|---|---:|---:|---:|---:|---:|"]
    for (name, n), c in got.items():
        limit = got.get((f"{name.split(',')[0]}, numpy limit", n))
        over = f"{c['open_first'] / limit['open_first']:.2f}x" if limit and "limit" not in name \
            else ""
        lines.append(f"| {name} | {n:,} | {c['open'] / 1e6:.2f}M | {c['first_take'] / 1e6:.2f}M "
                     f"| {c['open_first'] / 1e6:.2f}M | {over} |")
    return lines


def table(runs: dict[tuple[str, int], list[dict[str, Any]]], unit: str) -> list[str]:
    """The medians of every store's rounds, in ``unit`` (``ms`` or ``cpu_ms``), and each
    store's open + first take over its numpy limit's."""
    med = {s: {k: statistics.median(r[k] for r in got) for k in got[0] if k != "profile"}
           for s, got in runs.items()}
    lines = ["| store | rows | open | first take | open + first take | over the numpy limit "
             "| first record by key |", "|---|---:|---:|---:|---:|---:|---:|"]
    for (name, n), m in med.items():
        limit = med.get((f"{name.split(',')[0]}, numpy limit", n))
        over = (f"{m[f'open_first_{unit}'] / limit[f'open_first_{unit}']:.2f}x"
                if limit and "limit" not in name else "")
        lines.append(f"| {name} | {n:,} | {m[f'open_{unit}']:.2f} | {m[f'first_take_{unit}']:.2f} "
                     f"| {m[f'open_first_{unit}']:.2f} | {over} | {m[f'first_key_{unit}']:.2f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000, 80_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="profile each store's first take")
    parser.add_argument("--instructions", action="store_true",
                        help="also count the instructions of opening and of the first take "
                        "(valgrind's callgrind; deterministic where the machine is loaded)")
    parser.add_argument("--stages", action="store_true",
                        help="also count the instructions of the stages of opening and of the "
                        "first take (tensorstore_cache's stores; valgrind's callgrind)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the stores are built (default: $TMPDIR/tensorstore-cache-cold)")
    add_results_options(parser, "cold")
    parser.set_defaults(out="first-read")
    args = parser.parse_args(argv)
    record = Record("benchmarks.cold.first_read", argv, results=args.results, name=args.out)
    record.config = {"sizes": args.sizes, "rounds": args.rounds, "profile": args.profile}
    work = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-cold").resolve()
    work.mkdir(parents=True, exist_ok=True)
    stores = {(name, n): (kind, root, synthetic_keys(n)[n // 2])
              for n in args.sizes for name, (kind, root) in build(work, n).items()}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {s: [] for s in stores}
    for _ in range(args.rounds):  # interleaved: every store once a round
        for s, (kind, root, key) in stores.items():
            runs[s].append(measure(kind, root, key))
    for (name, n), got in runs.items():
        record.figures.setdefault("stores", []).append(
            {"kind": name, "rows": n,
             "medians_ms": {k: statistics.median(r[k] for r in got) for k in got[0]
                            if isinstance(got[0][k], (int, float))},
             "rounds": [{k: v for k, v in r.items() if k != "profile"} for r in got]})
    for unit, what in (("ms", "wall"), ("cpu_ms", "CPU")):
        record.print()
        record.print(f"medians of {args.rounds} rounds, {what} ms (fresh process each):")
        record.print()
        for line in table(runs, unit):
            record.print(line)
    if args.instructions:
        record.print()
        record.print("instructions (valgrind --tool=callgrind, each part counted alone in a "
                     "fresh process):")
        record.print()
        for line in instruction_table(stores):
            record.print(line)
    if args.stages:
        record.print()
        record.print("instructions of the stages (valgrind --tool=callgrind; each stage's "
                     "function with what it calls, alone in a fresh process):")
        record.print()
        for line in stage_table(stores):
            record.print(line)
    if args.profile:
        for (name, n), (kind, root, key) in stores.items():
            if kind == "tsc":
                record.print()
                record.print(f"profile of the first take, {name}, {n:,} rows:")
                record.print("```text")
                record.print(measure(kind, root, key, profile=True)["profile"])
                record.print("```")
    record.save(workdir=work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
