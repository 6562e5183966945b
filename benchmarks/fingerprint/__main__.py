"""``python -m benchmarks.fingerprint``: runs :mod:`benchmarks.fingerprint.fingerprint` as the main module."""

import importlib.util
import runpy

if importlib.util.find_spec("torchvision") is None:
    raise SystemExit("benchmarks.fingerprint needs torchvision: run it with "
                     ".venv-torchvision/bin/python (make test-torchvision sets it up)")
runpy.run_module("benchmarks.fingerprint.fingerprint", run_name="__main__", alter_sys=True)
