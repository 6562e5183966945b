"""The same loader gets the same automatic id in every fresh interpreter, however it is run.

Each run is a new process (a script, ``python -c``, stdin, an import from a
module, a real notebook kernel), under several ``PYTHONHASHSEED`` values; edits
that do not change what the loader computes (comments, blank lines, moving it,
editing, adding or removing its docstring) keep the id, in new processes too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# A loader that reads a helper, module values, an array, a set, a comprehension and a default.
SOURCE = '''\
import functools

import numpy as np
from PIL import Image

import tensorstore_cache as tsc

SIZE = (8, 8)
MEAN = np.linspace(0, 1, 16, dtype=np.float32)
NAMES = {"a", "b", "c"}


def resize_to(img, size):
    return img.resize(size)


def image_vector(path, scale=1.0):
    """Load one cover."""
    # the image, resized
    img = resize_to(Image.open(path), SIZE)
    words = [c + "x" for c in path]
    return np.asarray(img, np.float32) * scale + MEAN[3] + (path[-1] in NAMES) + len(words)


LOADER = functools.partial(image_vector, scale=2.0)
'''
SHOW = "print('ID', tsc.loader_fingerprint(LOADER).loader_id)\n"
HANG_GUARD_S = 240


def _env(seed: str) -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": seed}


def _ids(text: str) -> list[str]:
    return re.findall(r"^ID (auto:\S+)$", text, re.M)


def _run(args: list[str], cwd: Path, seed: str, stdin: str | None = None) -> str:
    proc = subprocess.run(args, cwd=cwd, env=_env(seed), input=stdin, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    found = _ids(proc.stdout)
    assert len(found) == 1, proc.stdout + proc.stderr
    return found[0]


def _by_script(tmp: Path, source: str, seed: str) -> str:
    script = tmp / "loader_script.py"
    script.write_text(source + SHOW)
    return _run([sys.executable, str(script)], tmp, seed)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _by_script(tmp_path_factory.mktemp("ref"), SOURCE, "0")


@pytest.mark.parametrize("seed", ["1", "12345", "random"])
@pytest.mark.parametrize("how", ["script", "-c", "stdin", "import"])
def test_one_id_in_every_fresh_interpreter(
    tmp_path: Path, reference: str, how: str, seed: str
) -> None:
    if how == "script":
        got = _by_script(tmp_path, SOURCE, seed)
    elif how == "-c":
        got = _run([sys.executable, "-c", SOURCE + SHOW], tmp_path, seed)
    elif how == "stdin":
        got = _run([sys.executable, "-"], tmp_path, seed, stdin=SOURCE + SHOW)
    else:
        (tmp_path / "covers_loader.py").write_text(SOURCE)
        show = "import covers_loader, tensorstore_cache as tsc\n" + SHOW.replace(
            "LOADER", "covers_loader.LOADER")
        got = _run([sys.executable, "-c", show], tmp_path, seed)
    assert got == reference and got.startswith("auto:image_vector/")


@pytest.mark.parametrize(("old", "new"), [
    ("    # the image, resized\n", "    # the image, resized to SIZE\n\n    # (bilinear)\n"),
    ('"""Load one cover."""', '"""Load one cover image as a float vector.\n\n    Longer."""'),
    ("def resize_to", "# the helper\n\n\ndef resize_to"),
    ("LOADER = functools.partial(image_vector, scale=2.0)\n",
     "\n\n\nLOADER = functools.partial(image_vector, scale=2.0)  # moved down\n"),
], ids=["comments-and-blank-lines", "docstring", "helper-comment", "moved"])
def test_edits_that_compute_nothing_keep_the_id(
    tmp_path: Path, reference: str, old: str, new: str
) -> None:
    assert old in SOURCE
    assert _by_script(tmp_path, SOURCE.replace(old, new), "7") == reference


# One loader ending in a bare ``return``, one returning a value: on CPython 3.11 the ``None``
# of a bare return sits where the docstring would, so adding one shifts the constants' indices.
ENDS = {
    "bare-return": "    print(SIZE, len(path), 'x', None)\n    return\n",
    "returns-a-value": "    out = SIZE * len(path) + 1.5\n    return ('x', out, None)\n",
}
DOCSTRING = '    """Show one path.\n\n    Longer, with "quotes" and \'x\'."""\n'


def _ended(body: str, doc: bool) -> str:
    return "import tensorstore_cache as tsc\nSIZE = 3\n\n\ndef image_vector(path):\n" + (
        DOCSTRING if doc else "") + body + "\n\nLOADER = image_vector\n"


@pytest.mark.parametrize("end", sorted(ENDS))
@pytest.mark.parametrize("change", ["adding", "removing"])
def test_adding_or_removing_a_docstring_keeps_the_id(tmp_path: Path, end: str, change: str) -> None:
    before, after = _ended(ENDS[end], change == "removing"), _ended(ENDS[end], change == "adding")
    assert (DOCSTRING in before) != (DOCSTRING in after)
    first = _by_script(tmp_path, before, "5")
    assert _by_script(tmp_path, after, "9") == first
    # and the constants still count: a changed one is a new id, with or without the docstring
    changed = after.replace("'x'", "'y'")
    assert changed != after and _by_script(tmp_path, changed, "9") != first


def test_moving_the_function_to_another_place_in_the_file(tmp_path: Path, reference: str) -> None:
    head, _, rest = SOURCE.partition("def resize_to")
    helper, _, tail = rest.partition("\n\n\ndef image_vector")
    moved = head + "def image_vector" + tail.replace(
        "\n\n\nLOADER", "\n\n\ndef resize_to" + helper + "\n\n\nLOADER")
    assert moved != SOURCE and moved.index("def resize_to") > moved.index("def image_vector")
    assert _by_script(tmp_path, moved, "3") == reference


def test_changed_values_get_new_ids_in_fresh_processes(tmp_path: Path, reference: str) -> None:
    for old, new in [("scale=2.0)", "scale=3.0)"), ('"c"}', '"d"}'), ("SIZE = (8, 8)", "SIZE = (8, 9)"),
                     ("img.resize(size)", "img.resize(size).convert('L')")]:
        assert _by_script(tmp_path, SOURCE.replace(old, new), "0") != reference, new


def test_a_notebook_cell_re_executed_and_edited(
    tmp_path: Path, reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    for var, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                     ("JUPYTER_DATA_DIR", "data"), ("JUPYTER_CONFIG_DIR", "config")):
        (tmp_path / "jupyter" / sub).mkdir(parents=True)
        monkeypatch.setenv(var, str(tmp_path / "jupyter" / sub))  # never the user's home
    edited = SOURCE.replace("NAMES = {", "EPOCHS = 3  # another line of the cell\nNAMES = {")
    cells = [nbformat.v4.new_code_cell(c + SHOW) for c in (SOURCE, SOURCE, edited)]
    nb = nbformat.v4.new_notebook(cells=cells)
    client = nbclient.NotebookClient(nb, timeout=HANG_GUARD_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    found = []
    for cell in nb.cells:
        assert not [o for o in cell.outputs if o.get("output_type") == "error"], cell.outputs
        found += _ids("".join(o.get("text", "") for o in cell.outputs
                              if o.get("output_type") == "stream"))
    assert found == [reference] * 3


# A loader reading what a script and an import name differently (__main__ or the module) and
# what iterates in hash-seed order: the user's enum, named tuple, slots dataclass, a
# functools.cache helper, a logger, a compiled pattern, a frozenset constant; and a lambda.
VALUES = '''\
import dataclasses
import enum
import functools
import logging
import re
from typing import NamedTuple

import tensorstore_cache as tsc

log = logging.getLogger("covers.loader")
logging.basicConfig()  # a handler on an open stream behind every logger


class Mode(enum.Enum):
    GREY = 1
    RGB = 3


class Size(NamedTuple):
    height: int = 8
    width: int = 8


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    size: Size = Size()
    mode: Mode = Mode.RGB


CONFIG = Config()
DIGITS = re.compile(r"\\d+")


@functools.cache
def weights(n):
    """Weights by position."""
    return tuple(1.0 / (i + 1) for i in range(n))


def load(path):
    log.debug("loading %s", path)
    vowel = path[-1] in {"a", "e", "i", "o", "u", "y", "w"}
    number = sum(int(d) for d in DIGITS.findall(path))
    area = CONFIG.size.height * CONFIG.size.width * CONFIG.mode.value
    return [area * w + vowel + number for w in weights(3)]


SQUARE = lambda path: len(path) ** 2  # noqa: E731
'''
SHOW_BOTH = ("print('ID', tsc.loader_fingerprint(load).loader_id + '+' "
             "+ tsc.loader_fingerprint(SQUARE).loader_id)\n")


@pytest.fixture(scope="module")
def values_reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("values")
    (where / "loader_script.py").write_text(VALUES + SHOW_BOTH)
    return _run([sys.executable, str(where / "loader_script.py")], where, "0")


@pytest.mark.parametrize(("how", "seed"), [
    ("script", "1"), ("-c", "2"), ("stdin", "3"), ("import", "4"), ("import", "random"),
])
def test_the_users_classes_wrappers_and_sets_in_every_fresh_interpreter(
    tmp_path: Path, values_reference: str, how: str, seed: str
) -> None:
    if how == "import":  # the classes' __module__ is covers_values, not __main__
        (tmp_path / "covers_values.py").write_text(VALUES)
        show = "import covers_values as m, tensorstore_cache as tsc\n" + SHOW_BOTH.replace(
            "(load)", "(m.load)").replace("(SQUARE)", "(m.SQUARE)")
        got = _run([sys.executable, "-c", show], tmp_path, seed)
    elif how == "script":
        (tmp_path / "loader_script.py").write_text(VALUES + SHOW_BOTH)
        got = _run([sys.executable, str(tmp_path / "loader_script.py")], tmp_path, seed)
    else:
        args = [sys.executable, "-c", VALUES + SHOW_BOTH] if how == "-c" else [sys.executable, "-"]
        got = _run(args, tmp_path, seed, stdin=VALUES + SHOW_BOTH if how == "stdin" else None)
    assert got == values_reference
    assert got.startswith("auto:load/") and "+auto:<lambda>/" in got


@pytest.mark.parametrize(("old", "new", "same"), [
    ('"""Weights by position."""', '"""Weights by position, edited."""', True),
    ("RGB = 3", "RGB = 4", False),
    ("width: int = 8", "width: int = 9", False),
    ('"y", "w"}', '"y"}', False),
    ("(i + 1)", "(i + 2)", False),
], ids=["helper-docstring", "enum-value", "named-tuple-default", "frozenset-member",
        "cached-helper-body"])
def test_edits_to_the_users_classes_and_wrappers_in_fresh_processes(
    tmp_path: Path, values_reference: str, old: str, new: str, same: bool
) -> None:
    assert old in VALUES
    script = tmp_path / "loader_script.py"
    script.write_text(VALUES.replace(old, new) + SHOW_BOTH)
    got = _run([sys.executable, str(script)], tmp_path, "5").partition("+")[0]
    assert (got == values_reference.partition("+")[0]) == same
