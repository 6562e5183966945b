"""``python -m benchmarks.cluster``: runs :mod:`benchmarks.cluster.copied` as the main module."""

import runpy

runpy.run_module("benchmarks.cluster.copied", run_name="__main__", alter_sys=True)
