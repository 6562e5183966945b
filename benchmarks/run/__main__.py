"""``python -m benchmarks.run``: runs :mod:`benchmarks.run.run` as the main module."""

import runpy

runpy.run_module("benchmarks.run.run", run_name="__main__", alter_sys=True)
