"""What a build with ``workers=2`` says when its pool's workers fail, and builds that ask for themselves.

* A loader raising in a worker: every failing path with the loader's
  exception type, message and last frames.
* A worker killed by a signal (SIGSEGV here; SIGKILL in ``test_crash``):
  the shard, its first source, "died by signal N".
* A worker that cannot load the loader (its module does not import in a
  fresh interpreter): that, with the ImportError.
* A loader that cannot be pickled at all: a TypeError before any process starts.
* A worker ignores SIGINT sent to it alone: the build goes on.
* Reentrancy: a loader, or the module it is imported from, asking for the
  cache being built fails at once with ReentrantBuildError instead of
  waiting forever for its own builder's lock (a fresh worker imports that
  module again; a forked one holds it already, and the build works).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache import config

from ..support._clients import (
    AsksForItsOwnCache,
    calls,
    environment,
    expected,
    in_pool_worker,
    python,
)

GUARD_S = 120


def _key_index(key: str) -> int:
    return int(key.rsplit("k", 1)[1])


def _check_source(key: str) -> None:
    if _key_index(key) in (3, 7, 140):
        raise ValueError(f"cover {key} is truncated")


def fails_on_some(key: str) -> np.ndarray:
    """Fails on k3 and k7 (first shard: the pool's worker) and k140 (last: the builder)."""
    _check_source(key)
    return np.full(4, _key_index(key), np.float32)


fails_on_some.item_shape = (4,)  # type: ignore[attr-defined]


def test_loader_error_in_a_worker_names_every_path_with_its_traceback(tmp_path: Path) -> None:
    keys = [f"k{i}" for i in range(150)]
    out = tmp_path / "s.tsc"
    with pytest.raises(tsc.BuildError) as info:
        tsc.build_store(keys, out, loader=fails_on_some, loader_id="fails/1", workers=2,
                        progress=False, identity="none")
    err = info.value
    reason = "ValueError: cover {} is truncated"
    assert err.failures == [(k, reason.format(k)) for k in ("k3", "k7", "k140")]
    message = str(err)
    for k in ("k3", "k7", "k140"):
        assert f"  {k}: {reason.format(k)}\n" in message, message
    # the loader's own frames, innermost last, where it raised
    assert message.count(f'{__file__}", line') >= 2, message
    assert re.search(r"line \d+, in fails_on_some\n\s+_check_source\(key\)\n", message), message
    assert re.search(r'line \d+, in _check_source\n\s+raise ValueError\(f"cover \{key\} is '
                     r'truncated"\)', message), message
    assert "(raised at the same place as above)" in message
    assert "_tasks.py" not in message  # none of the builder's own frames
    assert not out.exists()
    assert pickle.loads(pickle.dumps(err)).failures == err.failures


def segfaults_in_a_worker(key: str) -> np.ndarray:
    if key == "k3" and in_pool_worker():  # the worker's first shard is always its own
        ctypes.string_at(0)  # SIGSEGV, as a crash in native code
    return np.full(4, _key_index(key), np.float32)


segfaults_in_a_worker.item_shape = (4,)  # type: ignore[attr-defined]


def test_worker_killed_by_a_signal_names_the_shard_and_the_signal(tmp_path: Path) -> None:
    keys = [f"k{i}" for i in range(200)]  # shards of 64: k3 is in the first
    out = tmp_path / "s.tsc"
    with pytest.raises(tsc.BuildError) as info:
        tsc.build_store(keys, out, loader=segfaults_in_a_worker, loader_id="segv/1", workers=2,
                        progress=False)
    message = str(info.value)
    assert "building shard vectors/c/0/0 (64 sources from 'k0') died by signal 11 (SIGSEGV)" \
        in message, message
    assert "nothing was published" in message
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".tsc-build-" in p.name]


def test_worker_that_cannot_load_the_loader_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(config.WORKER_START_ENV, "spawn")  # a forked worker has the module
    module = tmp_path / "mods" / "private_thumbnails.py"
    module.parent.mkdir()
    module.write_text("import numpy as np\n\n\ndef load(key):\n"
                      "    return np.full(4, int(key[1:]), np.float32)\n")
    sys.path.insert(0, str(module.parent))
    try:
        import private_thumbnails  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(module.parent))  # importable here, not in a fresh interpreter
    try:
        with pytest.raises(tsc.BuildError) as info:
            tsc.build_store([f"k{i}" for i in range(150)], tmp_path / "s.tsc",
                            loader=private_thumbnails.load, loader_id="p/1", workers=2,
                            progress=False)
    finally:
        sys.modules.pop("private_thumbnails", None)
    message = str(info.value)
    assert "worker processes could not load the loader" in message, message
    assert "ModuleNotFoundError: No module named 'private_thumbnails'" in message, message
    assert "workers=1" in message
    assert not (tmp_path / "s.tsc").exists()


class HoldsALock:
    item_shape = (4,)

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, key: str) -> np.ndarray:
        with self.lock:
            return np.zeros(4, np.float32)


def test_unpicklable_loader_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"cannot be sent to worker processes .*lock"):
        tsc.build_store([f"k{i}" for i in range(150)], tmp_path / "s.tsc", loader=HoldsALock(),
                        loader_id="l/1", workers=2, progress=False)
    store = tsc.build_store([f"k{i}" for i in range(150)], tmp_path / "s.tsc",
                            loader=HoldsALock(), loader_id="l/1", workers=1, progress=False, identity="none")
    assert len(store) == 150


def interrupts_itself(key: str) -> np.ndarray:
    if key == "k1" and in_pool_worker():
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C meant for somebody else
    return np.full(4, _key_index(key), np.float32)


interrupts_itself.item_shape = (4,)  # type: ignore[attr-defined]


def test_a_worker_ignores_sigint(tmp_path: Path) -> None:
    keys = [f"k{i}" for i in range(150)]
    store = tsc.build_store(keys, tmp_path / "s.tsc", loader=interrupts_itself,
                            loader_id="i/1", workers=2, progress=False, identity="none")
    np.testing.assert_array_equal(store.take(np.arange(150))[:, 0], np.arange(150))


# -- reentrancy ---------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2])
def test_loader_asking_for_its_own_cache_fails_at_once(
    tmp_path: Path, client_images: list[str], workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a fresh worker: a forked one knows the loader builds that cache, as the builder does
    monkeypatch.setenv(config.WORKER_START_ENV, "spawn")
    cache = str(tmp_path / "cache")
    with pytest.raises(tsc.BuildError) as info:
        tsc.cached(client_images, cache_dir=cache, loader=AsksForItsOwnCache(cache),
                   workers=workers, progress=False)
    failures = info.value.failures
    assert [p for p, _r in failures] == client_images  # in the builder and in its worker
    assert all(r.startswith("ReentrantBuildError: ") for _p, r in failures), failures[:2]
    assert "must not call cached() or build_store() on the cache it fills" in failures[0][1] \
        or "is a worker of the build of" in failures[0][1], failures[0]
    if workers == 2:  # the pool's worker knows its parent builds that cache
        assert any("is a worker of the build of" in r for _p, r in failures), failures
    (ns,) = [p for p in Path(cache).iterdir() if not p.name.startswith(".")]
    assert not any(".tsc-build-" in p.name for p in (ns / "parts").iterdir())


_MODULE = '''
import numpy as np

import tensorstore_cache as tsc


def load(path):
    return tsc.ImageLoader(size=(8, 8))(path)


# a module of the user's that builds at import: its workers import it too
store = tsc.cached(open(PATHS).read().splitlines(), cache_dir=CACHE, loader=load,
                   loader_id="thumbs/1", workers=2, progress=False)
'''


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_a_module_that_builds_at_import_fails_at_once_in_fresh_workers_and_works_forked(
    tmp_path: Path, client_images: list[str], start: str
) -> None:
    listing = tmp_path / "paths.txt"
    listing.write_text("\n".join(client_images))
    (tmp_path / "thumbs.py").write_text(
        f"PATHS, CACHE = {str(listing)!r}, {str(tmp_path / 'cache')!r}\n" + _MODULE
    )
    (tmp_path / "train.py").write_text("import thumbs\n\nprint(len(thumbs.store))\n")
    env = environment(**({config.WORKER_START_ENV: "spawn"} if start == "spawn" else {}))
    proc = subprocess.run([python(), "train.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=GUARD_S, env=env)
    if start == "fork":  # a forked worker holds the module already, and does not import it
        assert proc.returncode == 0 and proc.stdout.strip() == "150", proc.stderr
        shutil.rmtree(tmp_path / "cache")
    else:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        err = proc.stderr
        assert "BuildError: the build's worker processes could not load the loader" in err, err
        assert "ReentrantBuildError: this process" in err and "is a worker of the build of" in err
        assert "thumbs.py" in err  # the frame of the import that asked for the cache
    # and the same module imported in a script that is run with workers=1 just works
    (tmp_path / "thumbs.py").write_text(
        f"PATHS, CACHE = {str(listing)!r}, {str(tmp_path / 'cache')!r}\n"
        + _MODULE.replace("workers=2", "workers=1"))
    proc = subprocess.run([python(), "train.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=GUARD_S, env=environment())
    assert proc.returncode == 0 and proc.stdout.strip() == "150", proc.stderr
    store = tsc.open_store(next(p for p in (tmp_path / "cache").iterdir()
                                if not p.name.startswith(".")))
    np.testing.assert_array_equal(store.stack(client_images), expected(client_images))


def test_reentrant_build_error_is_clear_and_pickles() -> None:
    err = tsc.ReentrantBuildError("message", "/cache/ns")
    assert isinstance(err, tsc.TensorStoreCacheError) and isinstance(err, RuntimeError)
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.path) == ("message", "/cache/ns")


def test_other_threads_of_the_builder_wait_rather_than_fail(
    tmp_path: Path, client_images: list[str]
) -> None:
    """Only the building thread and its workers are refused: another thread waits."""
    from ..support._clients import LoggedImages

    log = tmp_path / "calls.log"
    cache = str(tmp_path / "cache")
    results: list[int] = []

    def other() -> None:
        store = tsc.cached(client_images, cache_dir=cache, loader=LoggedImages(log),
                           workers=2, progress=False)
        results.append(len(store))

    threads = [threading.Thread(target=other) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD_S)
    assert results == [150, 150]
    assert len(calls(log)) == 150
