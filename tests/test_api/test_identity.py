"""Keys that are not files: ``identity="none"``, version tokens, and the error under ``"stat"``.

The system calls a cache makes on its keys are counted in real processes (the caller and its
build workers) through a ``sitecustomize`` module that wraps ``os.stat``, ``os.lstat``,
``os.open`` and ``open``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tensorstore_cache as tsc

REPO = Path(__file__).resolve().parents[2]
MARK = "nonexistent-tsc-keys"

SITECUSTOMIZE = f"""
import builtins, io, os
_log = os.environ.get("TSC_TEST_CALL_LOG")
if _log:
    _fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _wrap(name, fn):
        def wrapped(path, *args, **kwargs):
            if isinstance(path, (str, bytes, os.PathLike)) and {MARK!r} in os.fsdecode(path):
                os.write(_fd, f"{{os.getpid()}} {{name}} {{os.fsdecode(path)}}\\n".encode())
            return fn(path, *args, **kwargs)
        return wrapped

    for _name in ("stat", "lstat", "open"):
        setattr(os, _name, _wrap("os." + _name, getattr(os, _name)))
    builtins.open = io.open = _wrap("open", builtins.open)
"""

SCRIPT = f"""
import os, sys
import numpy as np
import tensorstore_cache as tsc

KEYS = ["/{MARK}/product-%d" % i for i in range(400)]

def load(key):
    os.path.exists("/{MARK}/control-in-a-worker")  # proves the hook runs where keys load
    return np.full(4, int(key.rsplit("-", 1)[1]), np.float32)

cache = sys.argv[1]
s = tsc.cached(KEYS, loader=load, loader_id="products/1", identity="none", cache_dir=cache,
               workers=2, progress=False)
assert [float(s[k][0]) for k in KEYS] == list(range(400))
assert s.stale() == [] and s.stale(identity="none") == []
s.close()
warm = tsc.cached(KEYS[::-1], loader=load, loader_id="products/1", identity="none",
                  cache_dir=cache, workers=2, progress=False)
assert float(warm[KEYS[7]][0]) == 7.0
os.path.exists("/{MARK}/control-in-the-caller")
print("pid", os.getpid())
"""


def test_identity_none_makes_no_system_call_on_the_keys(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    script = tmp_path / "products.py"
    script.write_text(textwrap.dedent(SCRIPT))
    log = tmp_path / "calls.log"
    env = {**os.environ, "TSC_TEST_CALL_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(hooks), str(REPO)])}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    caller = proc.stdout.split("pid", 1)[1].split()[0]
    calls = log.read_text().splitlines()
    controls = [c for c in calls if "control-in" in c]
    # the hook is live in the caller and in the build workers
    assert any(c.startswith(caller + " ") and "control-in-the-caller" in c for c in controls)
    assert any(not c.startswith(caller + " ") and "control-in-a-worker" in c for c in controls)
    assert [c for c in calls if "control-in" not in c] == []  # not one call on a key


def _products(tmp_path: Path) -> tuple[list[str], Path, Path]:
    keys = [f"product-{i}" for i in range(6)]
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(dict.fromkeys(keys, 1)))
    return keys, tokens, tmp_path / "calls.txt"


class TokenLoader:
    """A product's vector: its version token (from a JSON file) and its number; logs calls."""

    def __init__(self, tokens: Path, calls: Path) -> None:
        self.tokens, self.calls = tokens, calls

    def __call__(self, key: str) -> np.ndarray:
        with open(self.calls, "a") as f:
            f.write(key + "\n")
        version = json.loads(self.tokens.read_text())[key]
        return np.array([version, int(key.rsplit("-", 1)[1])], np.float32)


class Tokens:
    """``identity=``: the current version token of every key, from the same JSON file."""

    def __init__(self, tokens: Path) -> None:
        self.tokens = tokens

    def __call__(self, keys: list[str]) -> np.ndarray:
        current = json.loads(self.tokens.read_text())
        return np.array([current[k] for k in keys], np.uint64)


def test_version_tokens_invalidate_exactly_the_keys_whose_token_changed(tmp_path: Path) -> None:
    keys, tokens, calls = _products(tmp_path)
    loader, identity = TokenLoader(tokens, calls), Tokens(tokens)
    kw = dict(loader=loader, loader_id="products/2", identity=identity,
              cache_dir=tmp_path / "cache", workers=1, progress=False)
    s = tsc.cached(keys, **kw)  # type: ignore[arg-type]
    assert sorted(calls.read_text().split()) == sorted(keys)
    assert s.stale(identity=identity) == []
    with pytest.raises(TypeError, match="version tokens"):
        s.stale()  # tokens cannot be checked without the function
    s.close()

    current = json.loads(tokens.read_text())
    current["product-2"], current["product-4"] = 7, 9
    tokens.write_text(json.dumps(current))
    calls.unlink()
    before = tsc.cached(keys, loader=loader, loader_id="products/2", identity=identity,
                        cache_dir=tmp_path / "cache", on_stale="ignore", progress=False)
    assert before.stale(identity=identity) == ["product-2", "product-4"]
    assert not calls.exists()  # on_stale="ignore": nothing recomputed
    before.close()

    after = tsc.cached(keys, **kw)  # type: ignore[arg-type]
    assert sorted(calls.read_text().split()) == ["product-2", "product-4"]
    assert [after[k][0] for k in keys] == [1, 1, 7, 1, 9, 1]
    assert after.stale(identity=identity) == []
    calls.unlink()
    tsc.cached(keys, **kw).close()  # type: ignore[arg-type]
    assert not calls.exists()  # settled: no call when no token changed


def test_tokens_of_the_wrong_length_or_type_are_refused(tmp_path: Path) -> None:
    keys, tokens, calls = _products(tmp_path)
    with pytest.raises((TypeError, ValueError), match=r"(?i)token"):
        tsc.cached(keys, loader=TokenLoader(tokens, calls), loader_id="products/3",
                   identity=lambda ks: np.zeros(len(ks) - 1, np.uint64),
                   cache_dir=tmp_path / "cache", workers=1, progress=False)
    assert not calls.exists()  # refused before anything was loaded


def test_keys_that_are_not_files_under_stat_name_the_way_out(tmp_path: Path) -> None:
    keys, tokens, calls = _products(tmp_path)
    with pytest.raises(tsc.BuildError, match="identity='none'") as err:
        tsc.cached(keys, loader=TokenLoader(tokens, calls), loader_id="products/4",
                   cache_dir=tmp_path / "cache", workers=1, progress=False)
    assert all(k in str(err.value) for k in keys)
    s = tsc.cached(keys, loader=TokenLoader(tokens, calls), loader_id="products/4",
                   identity="none", cache_dir=tmp_path / "cache", workers=1, progress=False)
    assert len(s) == len(keys) and s.stale() == []


def test_check_is_gone_identity_names_the_kind(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"abcd")
    with pytest.raises(TypeError, match="check"):
        tsc.cached([str(src)], loader=np.atleast_1d, loader_id="x/1", check="stat", identity="stat",  # type: ignore[call-arg]
                   cache_dir=tmp_path / "cache")
    s = tsc.build_store([str(src)], tmp_path / "s.tsc",
                        loader=lambda p: np.frombuffer(Path(p).read_bytes(), np.uint8),
                        workers=1, progress=False)
    os.utime(src, ns=(1, 1))  # touched, same content
    with pytest.raises(TypeError, match="check"):
        s.stale(check="stat")  # type: ignore[call-arg]
    assert s.stale(identity="stat") == [str(src)]
    assert s.stale(identity="none") == []
