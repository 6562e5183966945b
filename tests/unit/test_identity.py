"""The automatic fingerprint of a loader (tensorstore_cache.identity), in one process.

Each case builds the loader from source, as a user's script would, in a
directory of its own (its local modules beside it), and compares ids. That the
same source gives the same id in fresh interpreters is tested in
tests/test_api/test_loader_names_stable.py.
"""

from __future__ import annotations

import functools
import io
import socket
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.identity import explain_change, moving_components
from tests.support._loader_source import build, ident

BASE = """
import numpy as np
SIZE = 4
def helper(x):
    return x * 2
def load(path):
    \"\"\"Load one path.\"\"\"
    # a comment
    return np.full(SIZE, helper(len(path)), np.float32)
"""


def test_the_id_names_the_loader_and_a_digest(tmp_path: Path) -> None:
    fp = tsc.loader_fingerprint(build(tmp_path, BASE))
    assert fp.loader_id.startswith("auto:load/") and len(fp.loader_id) == len("auto:load/") + 16
    paths = {c.path: c.origin for c in fp.components}
    assert paths["load"] == "user" and paths["load -> helper helper"] == "user"
    assert paths["load -> global SIZE"] == "user" and paths["load -> global np.full"] == "library"
    assert fp.versions["numpy"] == np.__version__ and fp.python == sys.implementation.cache_tag
    assert "load -> helper helper" in str(fp)


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("# a comment", "# another comment\n\n    # and a blank line above"),
    lambda s: s.replace("Load one path.", "Load one path, documented at length."),
    lambda s: "\n\n\n# moved down\n" + s,
    lambda s: s.replace("def helper", "# helper's comment\ndef helper"),
], ids=["comments-and-blank-lines", "docstring", "moved", "helper-comment"])
def test_what_does_not_compute_keeps_the_id(tmp_path: Path, edit: Any) -> None:
    assert ident(tmp_path, edit(BASE)) == ident(tmp_path, BASE)


@pytest.mark.parametrize("edit", [
    lambda s: s.replace("SIZE = 4", "SIZE = 5"),
    lambda s: s.replace("x * 2", "x * 3"),
    lambda s: s.replace("np.float32)", "np.float64)"),
    lambda s: s.replace("helper(len(path))", "helper(len(path) + 1)"),
], ids=["module-value", "helper-body", "global-attribute", "constant"])
def test_what_computes_changes_the_id(tmp_path: Path, edit: Any) -> None:
    assert ident(tmp_path, edit(BASE)) != ident(tmp_path, BASE)


@pytest.mark.parametrize(("source", "old", "new"), [
    # a comprehension's first constant is a string it loads (CPython 3.10/3.11): kept
    ("def load(path):\n    return [c + 'x' for c in path]\n", "'x'", "'y'"),
    # a literal equal to the docstring is one constant with it: loaded, so kept
    ("def load(path):\n    'x'\n    return 'x'\n", "return 'x'", "return 'y'"),
    # nested code is digested with its constants
    ("def load(path):\n    def inner(p):\n        return p * 2\n    return inner(path)\n",
     "p * 2", "p * 3"),
    ("def load(path):\n    return sorted(path, key=lambda c: (c, 'a'))\n", "'a'", "'b'"),
], ids=["comprehension-first-string", "literal-equal-to-docstring", "inner-function", "lambda"])
def test_a_loaded_constant_counts_wherever_it_sits(
    tmp_path: Path, source: str, old: str, new: str
) -> None:
    assert ident(tmp_path, source.replace(old, new)) != ident(tmp_path, source)


def test_a_docstring_added_or_removed_keeps_the_id(tmp_path: Path) -> None:
    bare = "def load(path):\n    print(len(path), None)\n    return\n"
    documented = bare.replace("(path):\n", "(path):\n    'Print one path.'\n")
    assert ident(tmp_path, documented) == ident(tmp_path, bare)
    value = "def load(path):\n    return (len(path), 'x', None)\n"
    assert ident(tmp_path, value.replace("(path):\n", "(path):\n    'Doc.'\n")) == ident(
        tmp_path, value)


def test_a_helper_in_another_local_module_two_levels_deep(tmp_path: Path) -> None:
    main = "import utils\ndef load(path):\n    return utils.resize(path)\n"
    utils = "import deep\ndef resize(p):\n    return deep.scale(len(p))\n"
    deep = "FACTOR = 2\ndef scale(n):\n    return n * FACTOR\n"
    first = ident(tmp_path, main, utils=utils, deep=deep)
    assert ident(tmp_path, main, utils=utils, deep=deep) == first
    assert ident(tmp_path, main, utils=utils.replace("len(p)", "len(p) + 1"), deep=deep) != first
    assert ident(tmp_path, main, utils=utils, deep=deep.replace("n * FACTOR", "n + FACTOR")) != first
    assert ident(tmp_path, main, utils=utils, deep=deep.replace("= 2", "= 3")) != first
    fp = tsc.loader_fingerprint(build(tmp_path, main, utils=utils, deep=deep))
    assert "load -> helper utils.resize -> helper deep.scale -> global FACTOR" in [
        c.path for c in fp.components]


@pytest.mark.parametrize(("source", "old", "new"), [
    ("def load(path, k=3):\n    return k\n", "k=3", "k=4"),
    ("def load(path, *, k=3):\n    return k\n", "k=3", "k=4"),
    ("def make(k):\n    def load(path):\n        return k\n    return load\nload = make(3)\n",
     "make(3)", "make(4)"),
    ("import functools\ndef f(path, k):\n    return k\nload = functools.partial(f, k=3)\n",
     "k=3", "k=4"),
    ("import functools\ndef f(k, path):\n    return k\nload = functools.partial(f, 3)\n",
     "f, 3", "f, 4"),
    ("import numpy as np\nT = np.zeros(1000)\nT[500] = 1\ndef load(path):\n    return T[0]\n",
     "T[500] = 1", "T[501] = 1"),
    ("def load(path):\n    return path in {'a', 'b'}\n", "'b'", "'c'"),
    ("load, other = (lambda p: 1), (lambda p: 2)\n", "load, other", "other, load"),
    ("CFG = {'size': 3}\ndef load(path):\n    return CFG['size']\n", "3}", "4}"),
], ids=["default", "keyword-default", "closure", "partial-keyword", "partial-arg",
        "one-element-of-a-global-array", "frozenset-member", "two-lambdas-on-a-line",
        "dict-value"])
def test_each_value_a_loader_computes_with_is_in_its_id(
    tmp_path: Path, source: str, old: str, new: str
) -> None:
    assert ident(tmp_path, source) == ident(tmp_path, source)
    assert ident(tmp_path, source.replace(old, new)) != ident(tmp_path, source)


CALLABLE = """
class Scale:
    def __init__(self, factor):
        self.factor = factor
    def __call__(self, path):
        return len(path) * self.factor
load = Scale(2)
bound = Scale(2).__call__
"""


def test_a_callable_object_by_its_class_and_attributes(tmp_path: Path) -> None:
    first = ident(tmp_path, CALLABLE)
    assert ident(tmp_path, CALLABLE.replace("Scale(2)\nbound", "Scale(3)\nbound")) != first
    assert ident(tmp_path, CALLABLE.replace("len(path) *", "len(path) +")) != first
    bound = tsc.loader_fingerprint(build(tmp_path, CALLABLE, name="bound"))
    assert bound.loader_id.startswith("auto:Scale.__call__/")
    assert bound.loader_id != first


def test_library_instances_by_their_state(tmp_path: Path) -> None:
    source = "import datetime\nSTEP = datetime.timedelta(days=1)\ndef load(p):\n    return STEP\n"
    assert ident(tmp_path, source) != ident(tmp_path, source.replace("days=1", "days=2"))
    paths = "import pathlib\nROOT = pathlib.Path('/a')\ndef load(p):\n    return ROOT / p\n"
    assert ident(tmp_path, paths) != ident(tmp_path, paths.replace("'/a'", "'/b'"))


def test_globals_the_loader_assigns_itself_are_named_by_name(tmp_path: Path) -> None:
    source = """
    _MODEL = None
    def load(path):
        global _MODEL
        if _MODEL is None:
            _MODEL = {"weights": 1}
        return _MODEL["weights"]
    """
    loader = build(tmp_path, source)
    before = tsc.loader_fingerprint(loader).loader_id
    loader("x")  # the model is now loaded: the same loader
    assert tsc.loader_fingerprint(loader).loader_id == before


def test_a_lock_is_named_by_its_type(tmp_path: Path) -> None:
    source = "import threading\nLOCK = threading.Lock()\ndef load(p):\n    with LOCK:\n" \
             "        return p\n"
    loader = build(tmp_path, source)
    first = tsc.loader_fingerprint(loader).loader_id
    loader.__globals__["LOCK"] = threading.Lock()
    assert tsc.loader_fingerprint(loader).loader_id == first
    assert ident(tmp_path, source.replace("threading.Lock()", "threading.RLock()")) != first


class _Holder:
    def __init__(self, inner: Any) -> None:
        self._session = inner

    def __call__(self, path: str) -> Any:
        return self._session


def _generator() -> Any:
    yield 1


@pytest.mark.parametrize(("inner", "why"), [
    (lambda tmp: open(tmp / "f.txt", "w"), "an open file"),  # noqa: SIM115
    (lambda tmp: socket.socket(), "a socket"),
    (lambda tmp: _generator(), "a generator"),
    (lambda tmp: np.random.default_rng(0), "a random generator"),
    (lambda tmp: __import__("random").Random(0), "a random generator"),
    (lambda tmp: sqlite3.connect(":memory:"), "an extension type"),
    (lambda tmp: np.zeros(2, dtype=[("a", object)]), "an array of records holding Python"),
], ids=["file", "socket", "generator", "numpy-rng", "random", "extension-object",
        "object-records"])
def test_what_has_no_content_is_refused_with_its_path(
    tmp_path: Path, inner: Any, why: str
) -> None:
    obj = inner(tmp_path)
    try:
        with pytest.raises(tsc.UnnamedLoaderError, match="needs a loader_id") as caught:
            tsc.loader_fingerprint(_Holder(obj))
    finally:
        if isinstance(obj, (io.IOBase, socket.socket, sqlite3.Connection)):
            obj.close()
    assert why in str(caught.value)
    assert caught.value.path.startswith("_Holder -> ._session (")
    assert isinstance(caught.value, ValueError)


def test_nonlocal_writes_are_refused(tmp_path: Path) -> None:
    source = """
    def make():
        count = 0
        def load(path):
            nonlocal count
            count += 1
            return count
        return load
    load = make()
    """
    with pytest.raises(tsc.UnnamedLoaderError, match="nonlocal") as caught:
        tsc.loader_fingerprint(build(tmp_path, source))
    assert caught.value.path.startswith("make.<locals>.load (")


def test_arrays_past_the_cap_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = "import numpy as np\nW = np.ones(1000)\ndef load(p):\n    return W\n"
    loader = build(tmp_path, source)
    assert tsc.loader_fingerprint(loader).nbytes == 8000
    with pytest.raises(tsc.UnnamedLoaderError, match="cap of 4000 bytes") as caught:
        tsc.loader_fingerprint(loader, cap=4000)
    assert caught.value.path == "load -> global W"
    monkeypatch.setenv("TSC_FINGERPRINT_CAP", "1K")
    with pytest.raises(tsc.UnnamedLoaderError, match="cap of 1024 bytes"):
        tsc.loader_fingerprint(loader)
    monkeypatch.setenv("TSC_FINGERPRINT_CAP", "lots")
    with pytest.raises(ValueError, match="TSC_FINGERPRINT_CAP='lots'"):
        tsc.loader_fingerprint(loader)


def test_a_batch_loader_without_its_execution_settings() -> None:
    class Embed(tsc.BatchLoader):
        def __init__(self, batch_size: int, devices: list[str], scale: float) -> None:
            self.batch_size, self.devices, self.scale = batch_size, devices, scale

        def prepare(self, key: str) -> int:
            return len(key)

        def __call__(self, items: list[Any]) -> Any:
            return np.array(items) * self.scale

    first = tsc.loader_fingerprint(Embed(8, ["cpu"], 1.0)).loader_id
    assert tsc.loader_fingerprint(Embed(64, ["cuda:1"], 1.0)).loader_id == first
    assert tsc.loader_fingerprint(Embed(8, ["cpu"], 2.0)).loader_id != first

    class Other(Embed):
        def prepare(self, key: str) -> int:
            return len(key) + 1

    assert tsc.loader_fingerprint(Other(8, ["cpu"], 1.0)).components[0].digest != \
        tsc.loader_fingerprint(Embed(8, ["cpu"], 1.0)).components[0].digest


def test_torch_weights_by_their_bytes() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(4, 2)

    def load(path: str) -> Any:
        return model(torch.zeros(4))

    first = tsc.loader_fingerprint(load)
    assert first.nbytes == (4 * 2 + 2) * 4
    with torch.no_grad():
        model.weight[1, 3] += 1
    assert tsc.loader_fingerprint(load).loader_id != first.loader_id
    half = torch.zeros(3, dtype=torch.bfloat16)
    assert tsc.loader_fingerprint(functools.partial(load, half)).nbytes == first.nbytes + 6


def test_the_change_is_explained_in_one_line(tmp_path: Path) -> None:
    old = tsc.loader_fingerprint(build(tmp_path, BASE))
    new = tsc.loader_fingerprint(build(tmp_path, BASE.replace("x * 2", "x * 3")))
    assert explain_change(old.to_json()["components"], new.components) == \
        "helper `helper` changed (load -> helper helper)"
    size = tsc.loader_fingerprint(build(tmp_path, BASE.replace("SIZE = 4", "SIZE = 5")))
    assert explain_change(old.components, size.components) == \
        "global `SIZE` changed (load -> global SIZE)"
    assert "cpython-399" in explain_change(old.components, new.components, "cpython-399",
                                           old.python)
    runs = [[[c.path, c.origin, c.digest, 0] for c in
             tsc.loader_fingerprint(build(tmp_path, BASE.replace("4", str(n)))).components]
            for n in (5, 6, 7)]
    assert moving_components(runs) == ["load -> global SIZE"]
