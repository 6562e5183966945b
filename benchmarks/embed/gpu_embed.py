"""The embedding build of ``benchmarks.embed`` on a GPU: ``devices=["cuda:0"]``.

Run ``python -m benchmarks.embed.gpu_embed [--images N] [--device cuda:0]``. Without a CUDA
device (or without torch) it prints ``no CUDA device`` and exits 0. Otherwise it builds
the embeddings of the covers with ``tsc.cached(..., loader=CoverEmbed(prepare=decode, devices=[device]))``
into a fresh cache and prints the items/s, the GPU memory of every process that held a
CUDA context during the build (sampled with ``nvidia-smi`` every 0.2 s: each is one
context) and how many there were: one, the device worker's, whatever ``--workers`` is.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import make_images


def cuda_available() -> bool:
    """Whether torch is importable here and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class GpuProcesses:
    """The compute processes of the GPUs and their peak memory, sampled with ``nvidia-smi``."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GpuProcesses:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _take(self) -> None:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                 "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                pid, mib = int(parts[0]), int(parts[1])
                self.peaks[pid] = max(self.peaks.get(pid, 0), mib)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(self.every_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="CPU processes that decode")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch directory (default: $TMPDIR/tensorstore-cache-embed)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not cuda_available():
        print("no CUDA device")
        return 0
    import tensorstore_cache as tsc
    from benchmarks.embed.embed import _paths
    from benchmarks.embed.embed_model import CoverEmbed, decode

    workdir = (args.workdir or Path(tempfile.gettempdir()) / "tensorstore-cache-embed").resolve()
    data = workdir / f"data-{args.images}-s{args.seed}"
    make_images.generate(data, args.images, args.seed, quiet=True)
    paths = _paths(data)
    cache = Path(tempfile.mkdtemp(prefix="gpu-embed-", dir=workdir))
    try:
        with GpuProcesses() as gpu:
            t0 = time.perf_counter()
            store = tsc.cached(paths, cache_dir=cache, loader=CoverEmbed(
                                   prepare=decode, batch_size=args.batch_size,
                                   devices=[args.device]),
                               workers=args.workers, progress=False)
            seconds = time.perf_counter() - t0
        assert store.spec.item_shape is not None
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{len(paths):,} covers on {args.device} in {seconds:.1f} s: "
          f"{len(paths) / seconds:,.0f} items/s (batch {args.batch_size}, "
          f"{args.workers} CPU workers decoding)")
    print(f"CUDA contexts during the build: {len(gpu.peaks)}")
    for pid, mib in sorted(gpu.peaks.items()):
        print(f"  pid {pid}: {mib} MiB of GPU memory at most")
    return 0


if __name__ == "__main__":
    sys.exit(main())
