"""Loaders built from source as a user's script builds them, for the fingerprint's tests.

:func:`build` runs a source as a script's main module in a directory of its own, with
its local modules beside it, and returns one of its names; :func:`ident` the automatic
id of its ``load``.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import textwrap
from pathlib import Path
from typing import Any

import tensorstore_cache as tsc

_count = itertools.count()


def build(tmp: Path, source: str, name: str = "load", **modules: str) -> Any:
    """Run ``source`` as a script's main module in a new directory; return its ``name``."""
    where = tmp / f"v{next(_count)}"
    where.mkdir()
    for module_name, text in modules.items():
        (where / f"{module_name}.py").write_text(textwrap.dedent(text))
        sys.modules.pop(module_name, None)
    main = where / "main.py"
    main.write_text(textwrap.dedent(source))
    sys.path.insert(0, str(where))
    try:
        spec = importlib.util.spec_from_file_location(f"main_{next(_count)}", main)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(where))
        for module_name in modules:
            sys.modules.pop(module_name, None)
    return getattr(module, name)


def ident(tmp: Path, source: str, **modules: str) -> str:
    """The automatic id of the ``load`` of ``source`` (see :func:`build`)."""
    return tsc.loader_fingerprint(build(tmp, source, **modules)).loader_id
