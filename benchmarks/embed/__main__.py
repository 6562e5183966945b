"""``python -m benchmarks.embed``: runs :mod:`benchmarks.embed.embed` as the main module."""

import runpy

runpy.run_module("benchmarks.embed.embed", run_name="__main__", alter_sys=True)
