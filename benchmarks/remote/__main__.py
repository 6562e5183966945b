"""``python -m benchmarks.remote``: runs :mod:`benchmarks.remote.remote` as the main module."""

import runpy

runpy.run_module("benchmarks.remote.remote", run_name="__main__", alter_sys=True)
