"""``python -m benchmarks.torch_batching``: runs :mod:`benchmarks.torch_batching.torch_batching` as the main module."""

import runpy

runpy.run_module("benchmarks.torch_batching.torch_batching", run_name="__main__", alter_sys=True)
