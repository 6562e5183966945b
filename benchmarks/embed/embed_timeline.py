"""Where a batched build's time goes: every stage of ``benchmarks.embed``'s build stamped.

Run ``python -m benchmarks.embed.embed_timeline [--images N ...] [--threads T]``. For each size,
it builds the embeddings of that many covers (the covers of ``benchmarks.embed``, made by
:mod:`benchmarks.common.make_images`) into a fresh cache, with the same ``tsc.cached`` call as the
embedding benchmark, and prints when, in seconds since the call, the device worker's
process started and received its loader, its ``setup`` started and ended, the first and last
batches ran, the first item was prepared in each process, and the call returned; beside each
stamp, the CPU seconds its process had used by then (user and system, since the process
started: what the device worker's interpreter, imports and model cost before its first batch),
and after each build the CPU seconds of the building process during the call and of the
worker processes it reaped. What is printed is written, with every size's events, to
``benchmarks/results/embed/embed-timeline.json`` and ``.md``, stamped with the run and the load
average at its start (``--results DIR``, ``--out NAME`` write them elsewhere).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt

import tensorstore_cache as tsc
from benchmarks.common import make_images
from benchmarks.common._record import Record, add_results_options
from benchmarks.common._report import compile_sources
from benchmarks.common._timeline import Stamps, event_line, process_started_at
from benchmarks.embed.embed_model import CoverEmbed, decode


class StampedEmbed(CoverEmbed):
    """:class:`~benchmarks.embed.embed_model.CoverEmbed`, stamping its set-up and every batch."""

    def __init__(self, stamps: Stamps, threads: int | None, **batching: Any) -> None:
        super().__init__(threads, **batching)
        self.stamps = stamps

    def __setstate__(self, state: dict[str, Any]) -> None:
        """In the device worker: stamp when its process started and when it has its loader."""
        self.__dict__.update(state)
        self.stamps("[0.000] device worker: process started", at=process_started_at())
        self.stamps("device worker: loader received", cpu=True)

    def setup(self, device: str) -> None:
        """Stamp, build the model, stamp."""
        self.stamps("setup started", cpu=True)
        super().setup(device)
        self.stamps("setup ended", cpu=True)

    def __call__(self, items: list[Any]) -> npt.NDArray[Any]:
        """Stamp, then embed the batch."""
        self.stamps(f"batch of {len(items)}", cpu=True)
        return super().__call__(items)


class StampedDecode:
    """:func:`~benchmarks.embed.embed_model.decode`, stamping the first item of each process."""

    def __init__(self, stamps: Stamps) -> None:
        self.stamps = stamps
        self.seen: set[int] = set()

    def __call__(self, path: str) -> npt.NDArray[Any]:
        if os.getpid() not in self.seen:
            self.seen.add(os.getpid())
            self.stamps("first item prepared", cpu=True)
        return decode(path)


def timeline(paths: list[str], threads: int | None, batch: int, workers: int) -> list[str]:
    """Build the embeddings of ``paths`` into a fresh cache; the stamped events, in order."""
    with tempfile.TemporaryDirectory() as tmp:
        stamps = Stamps(str(Path(tmp) / "stamps"), time.time())
        reaped, cpu = _children_cpu(), time.process_time()
        stamps("cached() called", cpu=True)
        tsc.cached(paths, cache_dir=Path(tmp) / "cache", loader=StampedEmbed(
                       stamps, threads, prepare=StampedDecode(stamps), batch_size=batch,
                       devices=["cpu"]),
                   workers=workers, progress=False).close()
        stamps("cached() returned", cpu=True)
        cpu, reaped = time.process_time() - cpu, _children_cpu() - reaped
        lines = Path(stamps.path).read_text(encoding="utf-8").splitlines()
    # in the order written (a process's events in order), then by time; "[C] what": C the CPU
    events: list[tuple[float, str, str, str]] = []
    for t, pid, stamped in (ln.split(" ", 2) for ln in lines):
        used, what = stamped[1:].split("] ", 1)
        events.append((float(t), pid, used, what))
    events.sort(key=lambda e: e[0])
    batches = [e for e in events if e[3].startswith("batch")]
    first, last = (batches[0], batches[-1]) if batches else (None, None)
    out = []
    for e in events:
        at, pid, used, what = e
        if e is first:
            what = f"first {what}"
        elif e is last:
            what = f"last {what} ({len(batches)} batches)"
        elif what.startswith("batch"):
            continue
        out.append(event_line(at, pid, used, what, digits=2))
    out.append(f"CPU: building process {cpu:.2f} s during the call, the workers it reaped "
               f"{reaped:.2f} s (the device worker and the CPU workers)")
    return out


def _children_cpu() -> float:
    """CPU seconds of the children this process has reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, nargs="+", default=[512, 20_000],
                        help="sizes to build (default 512 20000)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the device worker (default: torch's own)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the covers are made (default: the embedding benchmark's)")
    parser.add_argument("--seed", type=int, default=0)
    add_results_options(parser, "embed")
    parser.set_defaults(out="embed-timeline")
    args = parser.parse_args(argv)
    compile_sources()
    record = Record("benchmarks.embed.embed_timeline", argv, results=args.results, name=args.out)
    record.config = {"images": args.images, "threads": args.threads,
                     "batch_size": args.batch_size, "workers": args.workers}
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-embed").resolve()
    data = workdir / f"data-{max(args.images)}-s{args.seed}"
    make_images.generate(data, max(args.images), args.seed, quiet=True)
    paths = sorted(str(p) for p in (data / "images").rglob("*.*"))
    record.print("```text")
    for n in args.images:
        record.print(f"{n:,} covers, batch {args.batch_size}, {args.workers} workers, "
                     f"torch threads {args.threads or 'default'}:")
        events = timeline(paths[:n], args.threads, args.batch_size, args.workers)
        record.figures.setdefault("sizes", []).append({"covers": n, "events": events})
        for line in [*events, ""]:
            record.print(line)
    record.print("```")
    record.save(workdir=workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
