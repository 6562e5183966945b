"""What naming a loader by what it computes costs each ``cached()`` call.

Run ``.venv-torchvision/bin/python -m benchmarks.fingerprint [--calls N] [--results DIR]``
(torchvision's own environment, ``make test-torchvision`` sets it up). A ``cached()``
call without a ``loader_id`` takes the loader's fingerprint once
(``tsc.loader_fingerprint``); this times it for:

- ``image_vector``: the write-up's transform, ``Image.open``, torchvision's
  ``Resize((32, 32))`` and ``ToTensor()``, in a ``Variable``;
- ``compose4``: a ``transforms.Compose`` of four transforms (``Resize``,
  ``CenterCrop``, ``ToTensor``, ``Normalize``);
- ``labels_100k``: a function reading a global dict of 100,000 path -> label
  entries (a Python container is digested item by item);
- ``resnet18``: a callable holding torchvision's ``resnet18`` (11.7 M float32
  weights, 44.7 MiB, digested by their full bytes).

The first call of each (the process's first fingerprint also reads where the
standard library and site-packages lie) and then ``--calls`` calls, the cases
interleaved round by round so that all see the same load; the median, the
fastest and the slowest. Writes ``benchmarks/results/fingerprint/fingerprint.json``
and its table, ``fingerprint.md``, stamped with the commit, command, machine and
date, and the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchvision
from PIL import Image
from torchvision import models, transforms

import tensorstore_cache as tsc
from benchmarks.common._report import environment, publish, seconds
from benchmarks.common._results import ResultsFile
from benchmarks.common._stamp import run_stamp

RESULTS = Path(__file__).resolve().parents[1] / "results" / "fingerprint"


def image_vector(path: str) -> Any:
    """The write-up's transform, as its users write it."""
    img = Image.open(path)
    img = transforms.Resize((32, 32))(img)
    return torch.autograd.Variable(transforms.ToTensor()(img))


COMPOSE4 = transforms.Compose([
    transforms.Resize((32, 32)),
    transforms.CenterCrop(28),
    transforms.ToTensor(),
    transforms.Normalize(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)),
])
LABELS = {f"/data/covers/{i:07d}.jpg": i % 10 for i in range(100_000)}


def label(path: str) -> Any:
    """A loader reading a global dict of 100,000 labels."""
    return torch.tensor([LABELS[path]], dtype=torch.float32)


class Embed:
    """A callable holding a model's weights."""

    def __init__(self) -> None:
        self.model = models.resnet18(weights=None).eval()

    def __call__(self, path: str) -> Any:
        with torch.no_grad():
            return self.model(transforms.ToTensor()(Image.open(path))[None])[0]


def cases() -> dict[str, tuple[str, Any]]:
    """The loaders timed, by name, with what each is."""
    return {
        "image_vector": ("the write-up's transform (Resize, ToTensor, Variable)", image_vector),
        "compose4": ("Compose of Resize, CenterCrop, ToTensor, Normalize", COMPOSE4),
        "labels_100k": ("a function reading a dict of 100,000 labels", label),
        "resnet18": ("a callable holding resnet18's weights", Embed()),
    }


def measure(loaders: dict[str, tuple[str, Any]], calls: int,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """The first call of each loader's fingerprint, then ``calls`` rounds of every one."""
    out: dict[str, Any] = {}
    for name, (what, loader) in loaders.items():
        t0 = clock()
        fp = tsc.loader_fingerprint(loader)
        out[name] = {"what": what, "first_s": clock() - t0, "loader_id": fp.loader_id,
                     "components": len(fp.components), "array_bytes": fp.nbytes, "calls": []}
    for _ in range(calls):
        for name, (_, loader) in loaders.items():
            t0 = clock()
            again = tsc.loader_fingerprint(loader)
            out[name]["calls"].append(clock() - t0)
            if again.loader_id != out[name]["loader_id"]:
                raise RuntimeError(f"{name}: the fingerprint moved ({again.loader_id})")
    for record in out.values():
        times = record.pop("calls")
        record.update(median_s=statistics.median(times), min_s=min(times), max_s=max(times),
                      n=len(times))
    return out


def table(report: dict[str, Any]) -> str:
    """The markdown table of a report."""
    env = report["env"]
    load = ", ".join(f"{x:.2f}" for x in env.get("loadavg_at_start") or [])
    end = ", ".join(f"{x:.2f}" for x in report.get("loadavg_at_end") or [])
    lines = ["# The cost of a loader's automatic fingerprint", "",
             f"torch {env['versions'].get('torch')}, torchvision {report['torchvision']}; "
             f"load average at the start {load}, at the end {end}.", "",
             "| loader | what | components | array bytes | first call | median | fastest | "
             "slowest |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in report["cases"].items():
        lines.append(f"| `{name}` | {r['what']} | {r['components']} | {r['array_bytes']:,} | "
                     f"{seconds(r['first_s'])} | {seconds(r['median_s'])} | "
                     f"{seconds(r['min_s'])} | {seconds(r['max_s'])} |")
    lines += ["", f"Each loader's `tsc.loader_fingerprint()`, as `cached()` takes it once per "
              f"call; median, fastest and slowest of {report['config']['calls']} calls after "
              "the first, the loaders interleaved."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="calls after the first (50)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    env = environment()
    run = run_stamp("benchmarks.fingerprint", argv, env)
    env["command"] = run["command"]
    report: dict[str, Any] = {"env": env, "config": {"calls": args.calls},
                              "torchvision": torchvision.__version__, "python": sys.version}
    report["cases"] = measure(cases(), args.calls)
    report["loadavg_at_end"] = list(os.getloadavg())
    print(publish(ResultsFile(args.results, "fingerprint"), report, table, run,
                  results=args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
