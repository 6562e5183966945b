"""``python -m benchmarks.sweep``: runs :mod:`benchmarks.sweep.sweep` as the main module."""

import runpy

runpy.run_module("benchmarks.sweep.sweep", run_name="__main__", alter_sys=True)
