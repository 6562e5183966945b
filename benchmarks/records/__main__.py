"""``python -m benchmarks.records``: runs :mod:`benchmarks.records.records` as the main module."""

import runpy

runpy.run_module("benchmarks.records.records", run_name="__main__", alter_sys=True)
