"""A batch loader whose module imports slowly in its device worker (``$TSC_TEST_SLOW_IMPORT``
seconds), with a declared item shape: nothing is probed, so the CPU workers connect to the
device worker as soon as they start."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

import tensorstore_cache as tsc

time.sleep(float(os.environ.get("TSC_TEST_SLOW_IMPORT", "0")))


class SlowStart(tsc.BatchLoader):
    """Four numbers per key, from its number; declares its item shape."""

    item_shape = (4,)

    def __call__(self, items: list[Any]) -> Any:
        return np.stack([np.full(4, int(str(k)[1:]), np.float32) for k in items])


class Unsendable(tsc.BatchLoader):
    """Returns what cannot be pickled back to the build."""

    def __call__(self, items: list[Any]) -> Any:
        return [lambda: 0 for _ in items]
