"""Where a cold build's time goes: the first agent's build and the records build, stamped.

Run ``python -m benchmarks.cold.cold_timeline [--images N] [--rounds R]``. Each round builds,
into a fresh directory, the store the main benchmark's first agent builds (``tsc.build_store``
of N covers, ``size=(32, 32)``, 2 workers) and the records benchmark's store (``tsc.cached``
with ``fields=`` and its :class:`~benchmarks.records.records_data.RecordLoader`, 2 workers),
and prints, in seconds since the call, when the pool was started and returned, when each
process started, had its imports done (its loader received), computed its first item and its
last, when the pool was closed, the store published, opened, and the call returned; beside
each stamp, the CPU seconds its process had used by then (user and system, since the process
started: a worker's first stamp after its start is what its interpreter and imports cost).
After each build: the CPU seconds of the building process during the call, of the worker
processes it reaped, and of every process the build started that still runs (a helper
process that lives as long as the building process). CPU seconds are what to compare on a
machine shared with other work, where the seconds since the call stretch with the load.
The building process's stamps are taken by wrapping the library's own functions; nothing
else is changed. The stores are removed after each round; what is printed is written, with
every round's events, to ``benchmarks/results/cold/timeline.json`` and ``.md``, stamped with
the run and the load average at its start (``--results DIR``, ``--out NAME`` write them
elsewhere).
"""

from __future__ import annotations

import argparse
import resource
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
from benchmarks.common._timeline import Stamps, event_line, process_started_at
from benchmarks.records import records_data
from benchmarks.records.records import cover_records
from benchmarks.records.records_methods.tsc import fields as record_fields

#: every how many items a process stamps its progress (its last stamp is its last item's)
EVERY = 50


def _stamp(stamps: Stamps, what: str) -> None:
    """Stamp ``what`` with this process's CPU seconds so far."""
    stamps(what, cpu=True)


def _children_cpu() -> float:
    """CPU seconds of the children this process has reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _helpers() -> dict[int, tuple[str, float]]:
    """The processes started by this one that still run: ``pid -> (command, CPU seconds)``."""
    import psutil

    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            cpu = child.cpu_times()
            out[child.pid] = (" ".join(child.cmdline())[-90:], cpu.user + cpu.system)
        except psutil.Error:
            continue
    return out


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
        self.stamps("[0.000] process started", at=process_started_at())
        _stamp(self.stamps, "imports done, loader received")

    def __call__(self, path: str) -> Any:
        self.count += 1
        if self.count == 1:
            _stamp(self.stamps, "first item")
        out = self.inner(path)
        if self.count % EVERY == 0:
            _stamp(self.stamps, f"item {self.count}")
        return out


@contextmanager
def _wrapped(stamps: Stamps) -> Iterator[None]:
    """Stamp the building process's stages by wrapping the library's own functions."""
    from tensorstore_cache import _api
    from tensorstore_cache.writer import builder, pool

    def around(owner: Any, name: str, what: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            _stamp(stamps, f"{what} started")
            try:
                return original(*args, **kwargs)
            finally:
                _stamp(stamps, f"{what} returned")

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
        if e[2].split("] ", 1)[-1].startswith("item "):
            last[e[1]] = e
    kept = [e for e in events if not e[2].split("] ", 1)[-1].startswith("item ")]
    for t, pid, what in last.values():
        cpu, item = what.split("] ", 1)
        kept.append((t, pid, f"{cpu}] last stamped item ({item}, every {EVERY})"))
    kept.sort(key=lambda e: e[0])
    out = []
    for t, pid, what in kept:
        cpu, event = what[1:].split("] ", 1)
        out.append(event_line(t, pid, cpu, event))
    return out


def timeline(kind: str, paths: list[str], inputs: Path, work: Path) -> list[str]:
    """Build one store of ``kind`` (``covers`` or ``records``) afresh; its stamped events."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    stamps = Stamps(str(work / "stamps"), time.time())
    helpers_before = _helpers()
    reaped, cpu = _children_cpu(), time.process_time()
    with _wrapped(stamps):
        _stamp(stamps, "call")
        if kind == "covers":
            loader = StampedLoader(tsc.ImageLoader(size=(32, 32)), stamps)
            tsc.build_store(paths, work / "covers.tsc", loader=loader, workers=2,
                            progress=False).close()
        else:
            loader = StampedLoader(records_data.RecordLoader(inputs), stamps)
            tsc.cached(paths, cache_dir=work / "cache", loader=loader,
                       loader_id=loader.loader_id, fields=record_fields(), workers=2,
                       progress=False).close()
        _stamp(stamps, "returned")
    cpu, reaped = time.process_time() - cpu, _children_cpu() - reaped
    events = _events(stamps.path)
    events.append(f"CPU: building process {cpu:.3f} s during the call, the workers it reaped "
                  f"{reaped:.3f} s")
    for pid, (command, used) in sorted(_helpers().items()):
        before = helpers_before.get(pid, (command, 0.0))[1]
        events.append(f"     still running: pid {pid} ({used - before:.3f} s during the call, "
                      f"{used:.3f} s in all) {command}")
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
