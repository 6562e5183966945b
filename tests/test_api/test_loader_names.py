"""cached() names a loader without a loader_id by what it computes.

Fresh processes reuse the namespace of an unchanged loader and compute
nothing; an edit gets a new namespace and one line saying why; an explicit
``loader_id`` (argument or attribute) wins and the built-in loader keeps its
id; per-run state and a loader that changes as it computes are warned about.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.cache.loader_record import RECORD

HANG_GUARD_S = 240

AGENT = """
import os, sys
import numpy as np
import tensorstore_cache as tsc

SCALE = 2.0

def thumb(path):
    with open(os.environ["CALLS"], "a") as log:
        log.write(path + "\\n")
    return np.full(4, len(path) * SCALE, np.float32)

paths = sys.argv[1:]
store = tsc.cached(paths, loader=thumb, cache_dir=os.environ["CACHE"], workers=1,
                   progress=False, identity="none")
print("SUM", float(store.stack(paths).sum()))
"""


def _agent(tmp: Path, source: str, keys: list[str], seed: str) -> tuple[str, str]:
    script = tmp / "agent.py"
    script.write_text(textwrap.dedent(source))
    env = {"CALLS": str(tmp / "calls.log"), "CACHE": str(tmp / "cache"), "PYTHONHASHSEED": seed,
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(script), *keys], env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def _calls(tmp: Path) -> list[str]:
    log = tmp / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_fresh_processes_reuse_the_namespace_and_an_edit_gets_a_new_one(tmp_path: Path) -> None:
    keys = [f"key{i:03d}" for i in range(6)]
    out, _ = _agent(tmp_path, AGENT, keys, "1")
    assert len(_calls(tmp_path)) == 6 and "SUM 288.0" in out
    for seed in ("2", "3"):  # other processes, other hash seeds: nothing computed again
        out, err = _agent(tmp_path, AGENT.replace("SCALE = 2.0", "SCALE = 2.0  # a comment"),
                          keys, seed)
        assert len(_calls(tmp_path)) == 6 and "SUM 288.0" in out and "new cache" not in err
    (caches,) = tsc.list_caches(tmp_path / "cache")
    assert caches.loader_id.startswith("auto:thumb/") and caches.parts == 1
    out, err = _agent(tmp_path, AGENT.replace("SCALE = 2.0", "SCALE = 3.0"), keys, "1")
    assert len(_calls(tmp_path)) == 12 and "SUM 432.0" in out
    assert "a new cache namespace for the loader 'thumb': global `SCALE` changed" in err
    assert len(tsc.list_caches(tmp_path / "cache")) == 2


def _load(path: str) -> Any:
    return np.full(3, len(path), np.float32)


class _Named:
    loader_id = "mine.named/1"

    def __call__(self, path: str) -> Any:
        return np.zeros(2, np.float32)


def test_explicit_ids_win_and_the_built_in_loader_keeps_its_own(
    tmp_path: Path, images: list[str]
) -> None:
    keys = ["a", "bb"]
    tsc.cached(keys, loader=_load, loader_id="mine.explicit/1", cache_dir=tmp_path, workers=1,
               progress=False, identity="none")
    tsc.cached(keys, loader=_Named(), cache_dir=tmp_path, workers=1, progress=False, identity="none")
    tsc.cached(images[:2], cache_dir=tmp_path, workers=1, progress=False, identity="none")
    tsc.cached(keys, loader=_load, cache_dir=tmp_path, workers=1, progress=False, identity="none")
    ids = sorted(c.loader_id for c in tsc.list_caches(tmp_path))
    auto = tsc.loader_fingerprint(_load).loader_id
    assert ids == sorted([auto, "mine.explicit/1", "mine.named/1", "tensorstore_cache.image/1"])
    namespace = next(p for p in tmp_path.iterdir() if p.name.startswith("auto_"))
    record = json.loads((namespace / RECORD).read_text())
    assert record["loader_id"] == auto and record["versions"]["numpy"] == np.__version__
    assert auto not in (namespace / "namespace.json").read_text().replace(auto, "", 1)
    assert "versions" not in json.loads((namespace / "namespace.json").read_text())
    for other in tmp_path.iterdir():
        if other.is_dir() and not other.name.startswith("auto_"):
            assert not (other / RECORD).exists()
    with pytest.raises(ValueError, match="automatic ones"):  # never equal to an automatic id
        tsc.cached(keys, loader=_load, loader_id=auto, cache_dir=tmp_path, progress=False)


def test_reuse_under_other_library_versions_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tsc.cached(["a"], loader=_load, cache_dir=tmp_path, workers=1, progress=False, identity="none")
    (namespace,) = [p for p in tmp_path.iterdir() if p.name.startswith("auto_")]
    record = json.loads((namespace / RECORD).read_text())
    record["versions"]["numpy"] = "1.0.0"
    (namespace / RECORD).unlink()
    (namespace / RECORD).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="tensorstore_cache"):
        tsc.cached(["a"], loader=_load, cache_dir=tmp_path, workers=1, progress=False, identity="none")
    assert f"numpy {np.__version__} (built under 1.0.0)" in caplog.text


def test_three_new_namespaces_in_a_day_are_warned_about(tmp_path: Path) -> None:
    state = {"run": 0}

    def per_run(path: str) -> Any:
        return np.full(2, state["run"], np.float32)

    for run in range(2):
        state["run"] = run
        tsc.cached(["a"], loader=per_run, cache_dir=tmp_path, workers=1, progress=False, identity="none")
    state["run"] = 2
    with pytest.warns(tsc.LoaderFingerprintWarning, match="3 new cache namespaces within a day")\
            as caught:
        tsc.cached(["a"], loader=per_run, cache_dir=tmp_path, workers=1, progress=False, identity="none")
    assert "per_run -> closure state" in str(caught[0].message)


PER_RUN = """
import os, sys, time, uuid
import numpy as np
import tensorstore_cache as tsc

RUN = {value}
OFFSET = 1.0

def tagged(path):
    return np.full(2, len(str(RUN)) + OFFSET, np.float32)

tsc.cached(sys.argv[1:], loader=tagged, cache_dir=os.environ["CACHE"], workers=1,
           progress=False, identity="none")
"""


@pytest.mark.parametrize("value", ["uuid.uuid4()", "time.time()"])
def test_per_run_state_is_warned_about_across_processes(tmp_path: Path, value: str) -> None:
    errs = [_agent(tmp_path, PER_RUN.format(value=value), ["a"], "1")[1] for _ in range(3)]
    assert "LoaderFingerprintWarning" not in errs[0] + errs[1]
    assert "a new cache namespace for the loader 'tagged': " in errs[1]
    assert "(tagged -> global RUN" in errs[1]  # a uuid's .int, the time's value
    assert "LoaderFingerprintWarning: the loader 'tagged' has had 3 new cache namespaces " \
           "within a day, each because tagged -> global RUN" in errs[2]
    assert len(tsc.list_caches(tmp_path / "cache")) == 3


def test_edits_of_different_parts_are_not_per_run_state(tmp_path: Path) -> None:
    source = PER_RUN.format(value="'fixed'")
    for old, new in [("", ""), ("OFFSET = 1.0", "OFFSET = 2.0"), ("'fixed'", "'fixed2'")]:
        _, err = _agent(tmp_path, source.replace(old, new) if old else source, ["a"], "1")
        assert "LoaderFingerprintWarning" not in err
    assert len(tsc.list_caches(tmp_path / "cache")) == 3


LOGGING = """
import logging, os, sys, warnings
import numpy as np
import tensorstore_cache as tsc

log = logging.getLogger("myproject.loader")
logging.basicConfig(level=logging.DEBUG)  # a handler on an open stream behind every logger
warnings.simplefilter("error")  # "changed while it computed" would fail the run

def load(path):
    log.debug("loading %s", path)
    return np.full(2, len(path), np.float32)

for _ in range(3):
    tsc.cached(sys.argv[1:], loader=load, cache_dir=os.environ["CACHE"], workers=1,
               progress=False, identity="none")
    logging.getLogger(f"another.{_}")
print("NAMESPACES", len(tsc.list_caches(os.environ["CACHE"])))
"""


def test_a_logger_the_loader_uses_keeps_one_namespace(tmp_path: Path) -> None:
    out, err = _agent(tmp_path, LOGGING, ["a", "bb"], "1")
    assert "NAMESPACES 1" in out and "loading bb" in err
    assert "new cache namespace" not in err


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: str) -> Any:
        self.calls += 1
        return np.zeros(2, np.float32)


def test_a_loader_that_changes_as_it_computes_is_warned_about(tmp_path: Path) -> None:
    with pytest.warns(tsc.LoaderFingerprintWarning, match="changed while it computed") as caught:
        tsc.cached(["a", "b"], loader=_Counting(), cache_dir=tmp_path, workers=1,
                   progress=False, identity="none")
    assert "_Counting -> .calls" in str(caught[0].message)


def test_a_loader_that_cannot_be_named_is_refused_with_the_path(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)

    def noisy(path: str) -> Any:
        return rng.random(2)

    with pytest.raises(tsc.UnnamedLoaderError, match="random generator") as caught:
        tsc.cached(["a"], loader=noisy, cache_dir=tmp_path, workers=1, progress=False, identity="none")
    assert "<locals>.noisy -> closure rng (numpy.random" in caught.value.path
    assert not list(tmp_path.iterdir())  # nothing written


class _Lengths(tsc.BatchLoader):
    def __call__(self, items: list[Any]) -> Any:
        return np.array([[len(k)] for k in items], np.float32)


def test_a_batch_loader_without_an_id_keeps_its_namespace_across_batch_sizes(
    tmp_path: Path
) -> None:
    for batch_size in (2, 3):
        store = tsc.cached(["a", "bb", "ccc"], loader=_Lengths(batch_size=batch_size),
                           cache_dir=tmp_path, progress=False, identity="none")
        assert store.stack(["a", "bb", "ccc"]).ravel().tolist() == [1.0, 2.0, 3.0]
    (info,) = tsc.list_caches(tmp_path)
    assert info.loader_id.startswith("auto:_Lengths/") and info.parts == 1
    tsc.cached(["a"], loader=_Lengths(prepare=lambda k: k * 2), cache_dir=tmp_path,
               progress=False, identity="none")  # what prepare computes is part of the name
    assert len(tsc.list_caches(tmp_path)) == 2
