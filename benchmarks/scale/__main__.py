"""``python -m benchmarks.scale``: runs :mod:`benchmarks.scale.scale` as the main module."""

import runpy

runpy.run_module("benchmarks.scale.scale", run_name="__main__", alter_sys=True)
