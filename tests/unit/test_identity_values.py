"""The values a loader's fingerprint reads, in one process: the user's enums, named tuples
and dataclasses by value, library objects by their pickle reduction, wrappers by what
they wrap, synchronisation objects by type, dicts with their order, and the limits
(depth, the cap over Python containers, what is refused).

That the same source gives the same id in fresh interpreters (a script and an import,
other hash seeds) is tested in tests/test_api/test_loader_names_stable.py.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorstore_cache as tsc
from tensorstore_cache.identity import origin
from tests.support._loader_source import build, ident

ENUM = """
import enum
class Scale(enum.Enum):
    SMALL = 32
    LARGE = 64
    def pixels(self):
        return self.value + 1
MODE = Scale.SMALL
def load(path):
    return MODE.pixels() * len(path) + Scale.LARGE.value
"""


@pytest.mark.parametrize(("old", "new"), [
    ("SMALL = 32", "SMALL = 16"),  # a member's value
    ("self.value + 1", "self.value + 2"),  # a method
    ("MODE = Scale.SMALL", "MODE = Scale.LARGE"),  # which member
], ids=["member-value", "method", "member"])
def test_the_users_enum_by_its_members_and_methods(tmp_path: Path, old: str, new: str) -> None:
    first = ident(tmp_path, ENUM)
    assert ident(tmp_path, ENUM) == first
    assert ident(tmp_path, ENUM.replace(old, new)) != first
    fp = tsc.loader_fingerprint(build(tmp_path, ENUM))
    assert {c.path: c.origin for c in fp.components}["load -> global MODE -> class Scale"] == "user"


@pytest.mark.parametrize(("source", "old", "new"), [
    ("from typing import NamedTuple\nclass Cfg(NamedTuple):\n    size: int = 32\n"
     "CFG = Cfg()\ndef load(p):\n    return CFG.size\n", "int = 32", "int = 16"),
    ("import collections\nP = collections.namedtuple('P', 'a b')\nPT = P(1, 2)\n"
     "def load(p):\n    return PT.a\n", "P(1, 2)", "P(3, 2)"),
    ("import dataclasses\n@dataclasses.dataclass(frozen=True, slots=True)\nclass Cfg:\n"
     "    size: int = 32\nCFG = Cfg()\ndef load(p):\n    return CFG.size\n", "= 32", "= 16"),
    ("import dataclasses\n@dataclasses.dataclass\nclass Cfg:\n    size: int = 32\n"
     "    def area(self):\n        return self.size ** 2\nCFG = Cfg()\n"
     "def load(p):\n    return CFG.area()\n", "** 2", "** 3"),
], ids=["NamedTuple", "namedtuple", "slots-dataclass", "dataclass-method"])
def test_the_users_tuples_and_dataclasses_by_value(
    tmp_path: Path, source: str, old: str, new: str
) -> None:
    assert ident(tmp_path, source) == ident(tmp_path, source)
    assert ident(tmp_path, source.replace(old, new)) != ident(tmp_path, source)


LOGGER = """
import logging
log = logging.getLogger("myproject.loader")
def load(path):
    log.debug("loading %s", path)
    return len(path)
"""


def test_a_logger_by_its_name(tmp_path: Path) -> None:
    loader = build(tmp_path, LOGGER)
    first = tsc.loader_fingerprint(loader)
    handler = logging.StreamHandler(sys.stderr)  # an open stream behind the logger
    log = logging.getLogger("myproject.loader")
    log.addHandler(handler)
    try:
        loader("a")
        logging.getLogger("myproject.other")  # another logger in the process
        again = tsc.loader_fingerprint(loader)
    finally:
        log.removeHandler(handler)
    assert again.loader_id == first.loader_id
    assert ident(tmp_path, LOGGER.replace("myproject.loader", "myproject.x")) != first.loader_id
    assert first.nbytes == 0 and len(first.components) < 8


CACHED_HELPER = '''
import functools
@functools.{decorator}
def table(n):
    """A lookup table."""
    return tuple(range(n))
def load(path):
    return table(4)[len(path) % 4]
'''


@pytest.mark.parametrize("decorator", ["cache", "lru_cache(maxsize=8)"])
def test_a_cached_helper_by_the_function_it_wraps(tmp_path: Path, decorator: str) -> None:
    source = CACHED_HELPER.format(decorator=decorator)
    loader = build(tmp_path, source)
    first = tsc.loader_fingerprint(loader).loader_id
    loader("ab")  # the cache fills: the same loader
    assert tsc.loader_fingerprint(loader).loader_id == first
    assert ident(tmp_path, source.replace("A lookup table.", "Edited.")) == first
    assert ident(tmp_path, source.replace("range(n)", "range(n + 1)")) != first
    assert "load -> helper table -> .__wrapped__" in [
        c.path for c in tsc.loader_fingerprint(loader).components]


def test_a_compiled_pattern_by_its_pattern_and_flags(tmp_path: Path) -> None:
    source = "import re\nPAT = re.compile(r'\\d+')\ndef load(p):\n    return PAT.findall(p)\n"
    first = ident(tmp_path, source)
    assert ident(tmp_path, source.replace("\\d+", "\\d*")) != first
    assert ident(tmp_path, source.replace("'\\d+')", "'\\d+', re.I)")) != first
    assert isinstance(build(tmp_path, source, "PAT"), re.Pattern)


@pytest.mark.parametrize(("make", "use"), [
    ("multiprocessing.Lock()", "with OBJ:\n        return len(p)"),
    ("multiprocessing.RLock()", "with OBJ:\n        return len(p)"),
    ("queue.Queue()", "OBJ.put(p)\n    return len(p)"),
    ("threading.Event()", "OBJ.set()\n    return len(p)"),
    ("threading.local()", "OBJ.model = len(p)\n    return OBJ.model"),
    ("concurrent.futures.ThreadPoolExecutor(1)", "return OBJ.submit(len, p).result()"),
], ids=["mp-lock", "mp-rlock", "queue", "event", "thread-local", "executor"])
def test_synchronisation_objects_are_named_by_their_type(
    tmp_path: Path, make: str, use: str
) -> None:
    source = ("import concurrent.futures, multiprocessing, queue, threading\n"
              f"OBJ = {make}\ndef load(p):\n    {use}\n")
    loader = build(tmp_path, source)
    first = tsc.loader_fingerprint(loader).loader_id
    loader("abc")  # its state moves: not part of the name
    assert tsc.loader_fingerprint(loader).loader_id == first
    if "Executor" in make:
        loader.__globals__["OBJ"].shutdown()


def test_dicts_go_in_with_their_order(tmp_path: Path) -> None:
    # a loader that iterates a dict computes with its order: reordering it is an edit
    source = ("STEPS = {'scale': 2, 'shift': 1}\ndef load(p):\n    x = len(p)\n"
              "    for name, k in STEPS.items():\n        x = x * k if name == 'scale' else x + k\n"
              "    return x\n")
    reordered = source.replace("{'scale': 2, 'shift': 1}", "{'shift': 1, 'scale': 2}")
    assert build(tmp_path, source)("ab") != build(tmp_path, reordered)("ab")
    assert ident(tmp_path, reordered) != ident(tmp_path, source)
    assert ident(tmp_path, source) == ident(tmp_path, source)


def test_a_library_modules_value_by_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "site-packages" / "tsc_fake_lib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(
        "class Model:\n    def __init__(self, scale):\n        self.scale = scale\n"
        "    def __call__(self, n):\n        return n * self.scale\nMODEL = Model(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    for cached in (origin._library_roots, origin.is_user_file):
        cached.cache_clear()
    try:
        source = "import tsc_fake_lib\ndef load(p):\n    return tsc_fake_lib.MODEL(len(p))\n"
        loader = build(tmp_path, source)
        first = tsc.loader_fingerprint(loader)
        paths = {c.path: c.origin for c in first.components}
        assert paths["load -> global tsc_fake_lib.MODEL"] == "library"
        assert paths["load -> global tsc_fake_lib.MODEL -> .scale"] == "user"
        sys.modules["tsc_fake_lib"].MODEL.scale = 4
        assert tsc.loader_fingerprint(loader).loader_id != first.loader_id
        # the interpreter's own state, reached through the standard library, by name
        env = build(tmp_path, "import os\ndef load(p):\n    return os.environ.get('TSC_X')\n")
        before = tsc.loader_fingerprint(env).loader_id
        monkeypatch.setenv("TSC_X", "1")
        assert tsc.loader_fingerprint(env).loader_id == before
    finally:
        sys.modules.pop("tsc_fake_lib", None)
        for cached in (origin._library_roots, origin.is_user_file):
            cached.cache_clear()


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_torch_generator_and_a_script_module_are_refused(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    scripted = torch.jit.script(torch.nn.Linear(2, 2))  # its weights live in C++

    def noisy(path: str) -> Any:
        return torch.rand(2, generator=gen)

    def compiled(path: str) -> Any:
        return scripted(torch.zeros(2))

    with pytest.raises(tsc.UnnamedLoaderError, match="a random generator") as caught:
        tsc.loader_fingerprint(noisy)
    assert "<locals>.noisy -> closure gen (torch." in caught.value.path
    with pytest.raises(tsc.UnnamedLoaderError, match="extension type") as caught:
        tsc.loader_fingerprint(compiled)
    assert "<locals>.compiled -> closure scripted -> " in caught.value.path


@pytest.mark.parametrize(("source", "old", "new"), [
    ("class Size(int):\n    pass\nSIZE = Size(32)\ndef load(p):\n    return SIZE\n", "32", "16"),
    ("import decimal\nSTEP = decimal.Decimal('0.5')\ndef load(p):\n    return STEP\n",
     "0.5", "0.25"),
    ("import pandas as pd\nDF = pd.DataFrame({'x': [1.0, 2.0]})\ndef load(p):\n"
     "    return DF['x'].iloc[0]\n", "[1.0, 2.0]", "[1.0, 3.0]"),
    ("import collections\nD = collections.defaultdict(int)\ndef load(p):\n    return D[p]\n",
     "defaultdict(int)", "defaultdict(float)"),
], ids=["int-subclass", "decimal", "dataframe", "defaultdict-factory"])
def test_state_kept_in_c_is_read_through_the_reduction(
    tmp_path: Path, source: str, old: str, new: str
) -> None:
    if "pandas" in source:
        pytest.importorskip("pandas")
    loader = build(tmp_path, source)
    first = tsc.loader_fingerprint(loader).loader_id
    loader("a")  # using it (the defaultdict gains a key: its content, a new id after)
    if "defaultdict" not in source:
        assert tsc.loader_fingerprint(loader).loader_id == first
    assert ident(tmp_path, source) == first
    assert ident(tmp_path, source.replace(old, new)) != first


def test_deep_nesting_is_refused_with_its_path(tmp_path: Path) -> None:
    source = "D = 0\nfor _ in range({n}):\n    D = [D]\ndef load(p):\n    return D\n"
    assert ident(tmp_path, source.format(n=50)) != ident(tmp_path, source.format(n=51))
    with pytest.raises(tsc.UnnamedLoaderError, match="nested more than 100 levels deep") as c:
        ident(tmp_path, source.format(n=400))
    assert c.value.path.startswith("load -> global D[0][0][0]") and " ... " in c.value.path
    limit = sys.getrecursionlimit()
    try:  # a stack already deep below the loader: said as clearly
        sys.setrecursionlimit(len(_frames()) + 120)
        with pytest.raises(tsc.UnnamedLoaderError, match="recursion limit"):
            ident(tmp_path, source.format(n=80))
    finally:
        sys.setrecursionlimit(limit)


def _frames() -> list[Any]:
    frame, found = sys._getframe(), []
    while frame is not None:
        found.append(frame)
        frame = frame.f_back  # type: ignore[assignment]
    return found


def test_an_object_array_by_its_items(tmp_path: Path) -> None:
    source = "import numpy as np\nNAMES = np.array([['a', 'b'], ['c', None]], dtype=object)\n" \
             "def load(p):\n    return NAMES[0, 1]\n"
    first = ident(tmp_path, source)
    assert ident(tmp_path, source) == first
    assert ident(tmp_path, source.replace("'c'", "'d'")) != first
    assert ident(tmp_path, source.replace("[['a', 'b'], ['c', None]]", "[['a', 'b', 'c', None]]")) \
        != first  # the shape
    held = np.array([1, (x for x in "ab")], dtype=object)
    with pytest.raises(tsc.UnnamedLoaderError, match="a generator") as caught:
        tsc.loader_fingerprint(lambda p: held[0])
    assert caught.value.path.endswith("<lambda> -> closure held[1] (generator)")


def test_the_cap_covers_python_containers(tmp_path: Path) -> None:
    source = "LABELS = {f'/data/{i:07d}.jpg': i % 10 for i in range(20_000)}\n" \
             "def load(p):\n    return LABELS[p]\n"
    loader = build(tmp_path, source)
    fp = tsc.loader_fingerprint(loader)
    with pytest.raises(tsc.UnnamedLoaderError, match="Python containers hold more than the "
                       "fingerprint's cap of 500000 bytes") as caught:
        tsc.loader_fingerprint(loader, cap=500_000)
    assert caught.value.path == "load -> global LABELS"
    loader.__globals__["LABELS"]["/data/0000005.jpg"] = 6  # one value of 20,000
    assert tsc.loader_fingerprint(loader).loader_id != fp.loader_id


def test_explicit_ids_are_checked(tmp_path: Path) -> None:
    def load(path: str) -> int:
        return len(path)

    for bad in ("", "  "):
        with pytest.raises(ValueError, match="is empty: give a name such as"):
            tsc.cached(["a"], loader=load, loader_id=bad, progress=False, cache_dir=tmp_path)
    with pytest.raises(TypeError, match="must be a string"):
        tsc.cached(["a"], loader=load, loader_id=3,  # type: ignore[arg-type]
                   progress=False, cache_dir=tmp_path)

    class Named:
        def __init__(self, loader_id: str) -> None:
            self.loader_id = loader_id

        def __call__(self, path: str) -> int:
            return len(path)

    with pytest.raises(ValueError, match="the loader's loader_id attribute 'auto:x/1': ids "
                       "starting with 'auto:' are the automatic ones"):
        tsc.cached(["a"], loader=Named("auto:x/1"), progress=False, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="the loader's loader_id attribute '' is empty"):
        tsc.cached(["a"], loader=Named(""), progress=False, cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written
