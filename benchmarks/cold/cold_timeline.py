"""Where a cold build's time goes: the first agent's build and the records build, stamped.

Run ``python -m benchmarks.cold.cold_timeline [--images N] [--rounds R]``. Each round builds,
into a fresh directory, the store the main benchmark's first agent builds (``tsc.build_store``
of N covers, ``size=(32, 32)``, 2 workers) and the records benchmark's store (``tsc.cached``
with ``fields=`` and its :class:`~benchmarks.records.records_data.RecordLoader`, 2 workers),
and prints, in seconds since the call, when the pool was started and returned, when each
process started, had its imports done (its loader received), computed its first item and its
last, when the pool was closed, the store published, opened, and the call returned. The
building process's stamps are taken by wrapping the library's own functions; nothing else is
changed. The stores are removed after each round; what is printed is written, with every
round's events, to ``benchmarks/results/cold/timeline.json`` and ``.md``, stamped with the run
(``--results DIR``, ``--out NAME`` write them elsewhere).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tensorstore_cache as tsc
from benchmarks.common import make_images
from benchmarks.common._record import Record, add_results_options
from benchmarks.common._report import compile_sources
from benchmarks.common._timeline import Stamps
from benchmarks.records import records_data
from benchmarks.records.records import cover_records
from benchmarks.records.records_methods.tsc import fields as record_fields

#: every how many items a process stamps its progress (its last stamp is its last item's)
EVERY = 50


def _started_at() -> float:
    """When this process started, in seconds since the epoch (to the kernel's clock tick:
    its start in ticks since boot against the uptime now, not the boot time in whole
    seconds that ``psutil`` adds)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class StampedLoader:
    """A loader that stamps when its process started and received it, its first item and
    every :data:`EVERY`-th, around ``inner`` (picklable: each worker gets its own)."""

    def __init__(self, inner: Any, stamps: Stamps) -> None:
        self.inner, self.stamps = inner, stamps
        self.loader_id = getattr(inner, "loader_id", "benchmarks.cold/1")
        self.count = 0
        self.received = False

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner, "stamps": self.stamps}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["inner"], state["stamps"])  # type: ignore[misc]
        self.received = True
        self.stamps("process started", at=_started_at())
        self.stamps("imports done, loader received")

    def __call__(self, path: str) -> Any:
        self.count += 1
        if self.count == 1:
            self.stamps("first item")
        out = self.inner(path)
        if self.count % EVERY == 0:
            self.stamps(f"item {self.count}")
        return out


@contextmanager
def _wrapped(stamps: Stamps) -> Iterator[None]:
    """Stamp the building process's stages by wrapping the library's own functions."""
    from tensorstore_cache import _api
    from tensorstore_cache.writer import builder, pool

    def around(owner: Any, name: str, what: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            stamps(f"{what} started")
            try:
                return original(*args, **kwargs)
            finally:
                stamps(f"{what} returned")

        setattr(owner, name, call)
        return lambda: setattr(owner, name, original)

    undo = [around(pool.BuildPool, "__init__", "pool start"),
            around(pool.BuildPool, "close", "pool close"),
            around(builder, "publish", "publish"),
            around(_api, "open_directory", "open")]
    try:
        yield
    finally:
        for u in undo:
            u()


def _events(path: str) -> list[str]:
    """The stamped events, by time; a process's item stamps reduced to its last."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    events = sorted(((float(t), int(pid), what) for t, pid, what in
                     (ln.split(" ", 2) for ln in lines)), key=lambda e: e[0])
    last: dict[int, tuple[float, int, str]] = {}
    for e in events:
        if e[2].startswith("item "):
            last[e[1]] = e
    kept = [e for e in events if not e[2].startswith("item ")]
    kept += [(t, pid, f"last stamped item ({what}, every {EVERY})")
             for t, pid, what in last.values()]
    kept.sort(key=lambda e: e[0])
    return [f"{t:7.3f} s  pid {pid}  {what}" for t, pid, what in kept]


def timeline(kind: str, paths: list[str], inputs: Path, work: Path) -> list[str]:
    """Build one store of ``kind`` (``covers`` or ``records``) afresh; its stamped events."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    stamps = Stamps(str(work / "stamps"), time.time())
    with _wrapped(stamps):
        stamps("call")
        if kind == "covers":
            loader = StampedLoader(tsc.ImageLoader(size=(32, 32)), stamps)
            tsc.build_store(paths, work / "covers.tsc", loader=loader, workers=2,
                            progress=False).close()
        else:
            loader = StampedLoader(records_data.RecordLoader(inputs), stamps)
            tsc.cached(paths, cache_dir=work / "cache", loader=loader,
                       loader_id=loader.loader_id, fields=record_fields(), workers=2,
                       progress=False).close()
        stamps("returned")
    events = _events(stamps.path)
    shutil.rmtree(work, ignore_errors=True)
    return events


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=10_000, help="covers (default 10000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both builds (default 3)")
    parser.add_argument("--kinds", default="covers,records", help="covers, records or both")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the covers are made (default: $TMPDIR/tensorstore-cache-cold)")
    parser.add_argument("--seed", type=int, default=0)
    add_results_options(parser, "cold")
    parser.set_defaults(out="timeline")
    args = parser.parse_args(argv)
    compile_sources()
    record = Record("benchmarks.cold.cold_timeline", argv, results=args.results, name=args.out)
    record.config = {"images": args.images, "rounds": args.rounds, "kinds": args.kinds}
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-cold").resolve()
    data = workdir / f"data-{args.images}-s{args.seed}"
    make_images.generate(data, args.images, args.seed, quiet=True)
    keys, ratings, _rows = cover_records(data)
    inputs = records_data.write_inputs(workdir / "inputs", keys, ratings, args.seed)
    for p in keys:  # every build starts with the covers in the page cache
        with open(p, "rb") as f:
            f.read()
    record.print("```text")
    for r in range(args.rounds):
        for kind in args.kinds.split(","):
            record.print(f"round {r + 1}, {kind}: {len(keys):,} covers, 2 workers")
            events = timeline(kind, keys, inputs, workdir / "build")
            record.figures.setdefault("rounds", []).append(
                {"round": r + 1, "kind": kind, "events": events})
            for line in [*events, ""]:
                record.print(line)
    record.print("```")
    record.save(workdir=workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
