"""``python -m benchmarks.guarantees``: runs :mod:`benchmarks.guarantees.guarantees` as the main
module."""

import runpy

runpy.run_module("benchmarks.guarantees.guarantees", run_name="__main__", alter_sys=True)
