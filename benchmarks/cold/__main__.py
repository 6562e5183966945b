"""``python -m benchmarks.cold``: the stamped timeline of the cold builds (:mod:`benchmarks.cold.cold_timeline`)."""

import runpy

runpy.run_module("benchmarks.cold.cold_timeline", run_name="__main__", alter_sys=True)
