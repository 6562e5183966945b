"""Benchmark methods that fail on purpose, for the tests of failures as results.

Given to ``python -m benchmarks.run --methods tests.support._failing_methods:NAME``; they are not
in the benchmark's registry (``benchmarks.common.methods.METHODS``), so ``make bench`` never runs
them. Each decodes like ``no_cache`` when it does not fail, and counts its agents' calls
to ``load`` with marker files in its work directory: the first agent's call is 1, the
1-agent round's 2, the agents of the K-agent rounds 3 and up.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.common.methods._base import Column
from benchmarks.common.methods.no_cache import NoCache


def _call_number(workdir: str) -> int:
    """1 for the first call of ``load`` on this work directory, then 2, 3..."""
    n = 1
    while True:
        try:
            fd = os.open(Path(workdir, f"call-{n}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            n += 1
            continue
        os.close(fd)
        return n


class _Counting(NoCache):
    synthetic = False

    def prepare(self, workdir: Path, paths: list[str]) -> dict[str, Any]:
        super().prepare(workdir, paths)
        workdir.mkdir(parents=True)
        return {"workdir": str(workdir)}


class KilledInRoundsOfMany(_Counting):
    """Works for the first agent and the 1-agent round; every agent of a round of K > 1
    agents holds its column, then SIGKILLs itself (as the OOM killer would)."""

    name = "killed_in_rounds_of_many"
    summary = "test only: agents of K > 1 rounds SIGKILL themselves"

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        column = super().load(state, paths, loader)
        if _call_number(state["workdir"]) >= 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return column


class Raises(_Counting):
    """Every agent raises in ``load``."""

    name = "raises"
    summary = "test only: load raises"

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        raise RuntimeError(f"deliberate failure in load() of {len(paths)} paths")


#: the file the sleeping agent writes in its method's work directory as it begins to sleep
SLEEPING = "sleeping"


class SleepsInRoundOfOne(_Counting):
    """Works for the first agent; the 1-agent round's agent writes :data:`SLEEPING` in its
    work directory, then sleeps for an hour. Its rounds have a time limit of their own (the
    other methods of the run keep the run's, so a loaded machine slowing them is no
    failure of theirs)."""

    name = "sleeps_in_round_of_one"
    summary = "test only: the 1-agent round's agent never finishes"
    agent_timeout_s = 60.0

    def load(self, state: dict[str, Any], paths: list[str], loader: Any = None) -> Column:
        if _call_number(state["workdir"]) == 2:
            Path(state["workdir"], SLEEPING).touch()
            time.sleep(3600)
        return super().load(state, paths, loader)


KILLED = KilledInRoundsOfMany()
RAISES = Raises()
SLEEPS = SleepsInRoundOfOne()
