"""``python -m benchmarks.micro``: runs :mod:`benchmarks.micro.micro` as the main module."""

import runpy

runpy.run_module("benchmarks.micro.micro", run_name="__main__", alter_sys=True)
