"""Stands for a model's module: importing it logs ``import <pid>`` (see :mod:`._batch_loaders`).

The log directory is ``$TSC_TEST_MODEL_LOG``; the device workers inherit it.
"""

from __future__ import annotations

import os

from ._batch_loaders import log

MODEL = "weights"

if os.environ.get("TSC_TEST_MODEL_LOG"):
    log(os.environ["TSC_TEST_MODEL_LOG"], f"import {os.getpid()}")
