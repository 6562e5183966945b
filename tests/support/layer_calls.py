"""Count the function calls between the package's layers on the common paths.

Run ``python -m tests.support.layer_calls [--keys N]``. It builds a small cache and a
small store in a temporary directory, then traces (``sys.setprofile``), in
this process:

* a warm ``cached()`` of every key (everything cached and current);
* ``open_store`` of the store through the node cache (``local_copy="always"``,
  the path a URL takes), then a first ``store[p]``: once with an empty node
  cache (the version is downloaded) and once with the version present.

For each it prints the calls made by the package's functions, those that
cross from one layer to another (``caller layer -> callee layer``), and the
number of each crossing. Layers are the package's subpackages and top-level
modules (``_api``, ``cache``, ``writer``, ``remote``, ``reader``, ``format``,
``fs``, ``config``...).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

PACKAGE = "tensorstore_cache"


def _layer(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__", "")
    if not isinstance(name, str) or not (name == PACKAGE or name.startswith(PACKAGE + ".")):
        return None
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def trace(fn: Callable[[], Any]) -> tuple[int, Counter[str]]:
    """Run ``fn``; return the package's calls and the crossings between layers."""
    calls = 0
    crossings: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal calls
        if event != "call":
            return
        callee = _layer(frame)
        if callee is None:
            return
        calls += 1
        back = frame.f_back
        caller = _layer(back) if back is not None else None
        if caller is not None and caller != callee:
            crossings[f"{caller} -> {callee}"] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls, crossings


def _loader(path: str) -> Any:
    return np.full(16, len(path), np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=2000)
    args = parser.parse_args(argv)
    import tensorstore_cache as tsc

    with tempfile.TemporaryDirectory() as tmp:
        keys = [os.path.join(tmp, f"src/{i:06d}.bin") for i in range(args.keys)]
        for k in keys:
            Path(k).parent.mkdir(exist_ok=True)
            Path(k).write_bytes(b"x" * 16)
            os.utime(k, (1_600_000_000, 1_600_000_000))
        cache = os.path.join(tmp, "cache")
        tsc.cached(keys, loader=_loader, loader_id="layer_calls/1", cache_dir=cache, workers=1,
                   progress=False).close()
        store_dir = os.path.join(tmp, "s.tsc")
        tsc.build_store(keys, store_dir, loader=_loader, loader_id="layer_calls/1", workers=1,
                        progress=False).close()
        node = os.path.join(tmp, "node")

        def warm_cached() -> None:
            tsc.cached(keys, loader=_loader, loader_id="layer_calls/1", cache_dir=cache,
                       workers=1, progress=False).close()

        def open_and_read() -> None:
            with tsc.open_store(store_dir, local_copy="always", cache_dir=node) as store:
                store[keys[7]]

        for what, fn in (
            ("warm cached()", warm_cached),
            ("open_store (node cache, empty) + store[p]", open_and_read),
            ("open_store (node cache, version present) + store[p]", open_and_read),
        ):
            calls, crossings = trace(fn)
            print(f"{what}: {calls} calls of the package's functions, "
                  f"{sum(crossings.values())} between layers")
            for pair, count in sorted(crossings.items(), key=lambda t: (-t[1], t[0])):
                print(f"    {count:6d}  {pair}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
