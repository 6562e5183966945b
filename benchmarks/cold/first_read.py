"""The first read in a fresh process: ``open_store``, the first ``take`` and the first record
by key, timed, and the first take profiled.

Run ``python -m benchmarks.cold.first_read [--sizes 5000 80000] [--rounds R] [--profile]``. It
builds, once per size, a store of synthetic records (the records benchmark's fields) and a
store of one tensor per key (``identity="none"``, 2 workers), then, round after round, starts a
fresh ``python`` for each store that imports the library and numpy, and reports the median of
the rounds for: ``tsc.open_store``, its first ``take`` of one row, and its first record by key;
with ``--profile``, the ``cProfile`` of that first take (cumulative, top 15) in one more
process per store. What is printed is written, with every round's figures, to
``benchmarks/results/cold/first-read.json`` and ``.md``, stamped with the run
(``--results DIR``, ``--out NAME`` write them elsewhere).
"""

from __future__ import annotations

import argparse
import json
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
from benchmarks.records.records_methods.tsc import fields as record_fields

_CHILD = r"""
import cProfile, io, json, pstats, sys, time
import numpy as np
import tensorstore_cache as tsc
root, key, profile = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
t0 = time.perf_counter()
store = tsc.open_store(root)
t1 = time.perf_counter()
prof = cProfile.Profile() if profile else None
if prof: prof.enable()
store.take(np.zeros(1, dtype=np.int64))
if prof: prof.disable()
t2 = time.perf_counter()
store[key]
t3 = time.perf_counter()
out = {"open_ms": 1e3 * (t1 - t0), "first_take_ms": 1e3 * (t2 - t1), "first_key_ms": 1e3 * (t3 - t2)}
if prof:
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(15)
    out["profile"] = text.getvalue()
print(json.dumps(out))
"""


def _tensor(key: str) -> Any:
    return np.full((3, 32, 32), int(key.rsplit("/", 1)[-1]) % 251, np.uint8)


def build(work: Path, n: int) -> dict[str, Path]:
    """The stores of ``n`` synthetic keys (records and tensors), built once."""
    keys = synthetic_keys(n)
    stores = {"records": work / f"records-{n}.tsc", "tensors": work / f"tensors-{n}.tsc"}
    if not stores["records"].exists():
        tsc.build_store(keys, stores["records"], loader=SyntheticRecords(), loader_id="cold/1",
                        fields=record_fields(), workers=2, progress=False,
                        identity="none").close()
    if not stores["tensors"].exists():
        tsc.build_store(keys, stores["tensors"], loader=_tensor, loader_id="cold-t/1",
                        workers=2, progress=False, identity="none").close()
    return stores


def measure(root: Path, key: str, profile: bool = False) -> dict[str, Any]:
    """One fresh process's open, first take and first record by key of ``root``."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(root), key, "1" if profile else "0"],
                          capture_output=True, text=True, check=True, timeout=300)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000, 80_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="profile each store's first take")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the stores are built (default: $TMPDIR/tensorstore-cache-cold)")
    add_results_options(parser, "cold")
    parser.set_defaults(out="first-read")
    args = parser.parse_args(argv)
    record = Record("benchmarks.cold.first_read", argv, results=args.results, name=args.out)
    record.config = {"sizes": args.sizes, "rounds": args.rounds, "profile": args.profile}
    work = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-cold").resolve()
    work.mkdir(parents=True, exist_ok=True)
    stores = {(kind, n): (root, synthetic_keys(n)[n // 2])
              for n in args.sizes for kind, root in build(work, n).items()}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {s: [] for s in stores}
    for _ in range(args.rounds):  # interleaved: every store once a round
        for s, (root, key) in stores.items():
            runs[s].append(measure(root, key))
    record.print(f"medians of {args.rounds} rounds, ms (fresh process each):")
    record.print()
    record.print("| store | rows | open_store | first take | first record by key |")
    record.print("|---|---:|---:|---:|---:|")
    for (kind, n), got in runs.items():
        med = {k: statistics.median(r[k] for r in got) for k in got[0]
               if isinstance(got[0][k], (int, float))}
        record.figures.setdefault("stores", []).append(
            {"kind": kind, "rows": n, "medians_ms": med,
             "rounds": [{k: v for k, v in r.items() if k != "profile"} for r in got]})
        record.print(f"| {kind} | {n:,} | {med['open_ms']:.2f} | {med['first_take_ms']:.2f} | "
                     f"{med['first_key_ms']:.2f} |")
    if args.profile:
        for (kind, n), (root, key) in stores.items():
            record.print()
            record.print(f"profile of the first take, {kind}, {n:,} rows:")
            record.print("```text")
            record.print(measure(root, key, profile=True)["profile"])
            record.print("```")
    record.save(workdir=work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
