"""Benchmark methods that record the state of their agent process, for the tests of the agents.

Given to ``python -m benchmarks.run --methods tests.support._probe_methods:NAME``; they are not
in the benchmark's registry (``benchmarks.common.methods.METHODS``), so ``make bench`` never runs
them. Each decodes like ``no_cache``.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.common.methods._base import Column
from benchmarks.common.methods.no_cache import NoCache

#: The directory the probes write to (the benchmark removes its work directory when it ends).
PROBE_DIR = "TSC_TEST_PROBE_DIR"


class GcAtLoad(NoCache):
    """Writes the garbage collector's counts when its ``load`` begins to
    ``$TSC_TEST_PROBE_DIR/gc-<pid>-<n>.json``, a file per call."""

    name = "gc_at_load"
    summary = "test only: records the garbage collector's counts when load begins"
    synthetic = False

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        counts = gc.get_count()  # first: nothing of this call counted yet
        if PROBE_DIR not in os.environ:
            raise RuntimeError(f"{self.name} writes to ${PROBE_DIR}: set it to a directory")
        out = Path(os.environ[PROBE_DIR])
        n = len(list(out.glob(f"gc-{os.getpid()}-*.json")))
        (out / f"gc-{os.getpid()}-{n}.json").write_text(json.dumps(counts))
        return super().load(state, paths, loader)


GC_AT_LOAD = GcAtLoad()
