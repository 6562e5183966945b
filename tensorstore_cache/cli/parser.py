"""The argument parser of the ``tensorstore-cache`` command: its options, help texts and
the types that check their values."""

from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from typing import Any, NoReturn

from .. import config

__all__ = ["PROG", "build_parser", "parse_size"]

PROG = "tensorstore-cache"
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

DESCRIPTION = """\
Preprocess once, map everywhere: build a store of image vectors once, then
let every process (sweep agents, DataLoader workers) map the same files.
"""

EPILOG = """\
examples:
  tensorstore-cache build data/images --out covers.tsc
  tensorstore-cache build train.csv --column img_path --out covers.tsc --size 32 32
  tensorstore-cache build paths.txt --out covers_u8.tsc --dtype uint8 --on-error skip
  tensorstore-cache info covers.tsc
  tensorstore-cache verify covers.tsc
  tensorstore-cache preview covers.tsc --out grid.png --n 64
  tensorstore-cache ls
  tensorstore-cache gc --older-than 30 --max-size 50G --dry-run

exit status: 0 ok, 1 the operation failed (load errors, missing or damaged
store), 2 the command line is wrong. Arguments can be read from a file, one
per line: tensorstore-cache preview covers.tsc --out g.png --paths @list.txt
"""


def parse_size(text: str) -> int:
    """Parse ``"50G"``, ``"512MiB"``, ``"1.5 TB"`` or ``"1048576"`` to bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: use bytes or a number with K, M, G or T (e.g. 50G, 512M)"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of days {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"days must be a number >= 0, got {text!r}")
    return value


class _Formatter(argparse.HelpFormatter):
    """Wraps prose paragraphs; keeps paragraphs with indented lines (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.strip("\n").split("\n\n"):
            if any(line.startswith("  ") for line in para.splitlines()):
                out.append("\n".join(indent + line for line in para.splitlines()))
            else:
                out.append(textwrap.fill(" ".join(para.split()), width, initial_indent=indent,
                                         subsequent_indent=indent))
        return "\n\n".join(out)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors: exit status 2, no traceback
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tensorstore-cache`` (also used for the docs).

    The chosen command's name is the parsed namespace's ``command``.
    """
    fmt = _Formatter
    parser = _Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=fmt,
                     fromfile_prefix_chars="@")
    parser.add_argument("--version", action="version", version=f"%(prog)s {config.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)
    for add in (_add_build, _add_info, _add_verify, _add_ls, _add_gc, _add_preview):
        add(sub, fmt)
    return parser


def _add_build(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``build`` command's arguments."""
    p = sub.add_parser(
        "build", help="build a store from images", formatter_class=fmt,
        description="Decode and resize every image once (in parallel) and publish the store "
                    "atomically. Paths are stored as given (normalised): build from the "
                    "directory you will train from, or use absolute paths.",
        epilog="SOURCE is a directory (searched recursively for .jpg .jpeg .png .gif .bmp .webp "
               ".tif .tiff), a CSV/TSV or Parquet file (see --column), a text file with one path "
               "per line (# comments allowed), or - for paths on standard input.\n\n"
               "examples:\n  tensorstore-cache build data/images --out covers.tsc\n"
               "  tensorstore-cache build books.csv --column img_path --out covers.tsc --workers 8",
    )
    p.add_argument("source", metavar="SOURCE", help="directory, CSV/Parquet table, path list, or -")
    p.add_argument("--out", required=True, metavar="STORE", help="the store directory to create")
    p.add_argument("--size", nargs=2, type=_positive_int, default=[32, 32], metavar=("H", "W"),
                   help="output height and width in pixels (default: 32 32)")
    p.add_argument("--dtype", choices=["float32", "uint8"], default="float32",
                   help="float32 in [0, 1] as ToTensor() (default), or uint8 pixels (4x smaller)")
    p.add_argument("--column", default="img_path", metavar="NAME",
                   help="column of paths in a CSV/Parquet SOURCE (default: img_path)")
    p.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="worker processes (default: every core)")
    p.add_argument("--on-error", choices=["raise", "skip"], default="raise",
                   help="raise: build nothing if any image fails (default); skip: build the rest")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _add_info(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``info`` command's arguments."""
    p = sub.add_parser("info", help="describe a store", formatter_class=fmt, description="Describe a store: entries, "
                       "vector shape and type (a store of records: every field with its dtype, "
                       "and its shape or the min / median / max length of its rows), loader "
                       "and its parameters, size on disk.")
    p.add_argument("store", metavar="STORE")
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_verify(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``verify`` command's arguments."""
    p = sub.add_parser("verify", help="check every file against its recorded checksum", formatter_class=fmt,
                       description="Re-read every file of a store and compare its size and "
                       "XXH3-128 with those recorded at build time. Exit status 1 if anything "
                       "is missing, damaged or unexpected.")
    p.add_argument("store", metavar="STORE")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress message")


def _add_ls(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``ls`` command's arguments."""
    p = sub.add_parser("ls", help="list the caches of a cache directory", formatter_class=fmt,
                       description="List the caches made by tensorstore_cache.cached(): owner "
                       "and mode, loader, vector shape, entries, size and when each was last "
                       "used. Caches that cached() would refuse (owned by another user, or "
                       "writable by others) are marked REFUSED, with the reason.")
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help="default: $TSC_CACHE_DIR, else ~/.cache/tensorstore_cache")
    p.add_argument("--share-with", metavar="GROUP", default=None,
                   help="list it as a cache shared with GROUP (default: $TSC_CACHE_GROUP, "
                        "else private)")
    p.add_argument("--remote", metavar="URL", default=None,
                   help="list the prefix shared by cached(remote=URL) instead: each cache's "
                        "generation, parts, and its current lease's holder and age "
                        "(credentials from the environment, e.g. AWS_* or FSSPEC_S3_*)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _add_gc(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``gc`` command's arguments."""
    p = sub.add_parser("gc", help="delete caches that are old or over a size budget",
                       formatter_class=fmt,
                       description="Delete leftovers of dead builds and superseded parts; with "
                       "--older-than and --max-size, whole caches too (least recently used "
                       "first). Caches being built are never touched; processes that have a "
                       "cache open keep reading it; other users' files are kept unless "
                       "--all-users is given.",
                       epilog="example:\n  tensorstore-cache gc --older-than 30 --max-size 50G --dry-run")
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help="default: $TSC_CACHE_DIR, else ~/.cache/tensorstore_cache")
    p.add_argument("--older-than", type=_days, default=None, metavar="DAYS",
                   help="delete caches not used for this many days")
    p.add_argument("--max-size", type=parse_size, default=None, metavar="SIZE",
                   help="then delete least recently used caches until at most SIZE remain "
                        "(e.g. 50G, 512M; powers of 1024)")
    p.add_argument("--dry-run", action="store_true", help="only show what would be deleted")
    p.add_argument("--share-with", metavar="GROUP", default=None,
                   help="the cache is shared with GROUP (default: $TSC_CACHE_GROUP, else "
                        "private)")
    p.add_argument("--all-users", action="store_true",
                   help="also delete other users' files, where the system allows it (a "
                        "member of a shared cache's group, or root); without it gc keeps "
                        "them and says so")
    p.add_argument("--remote", metavar="URL", default=None,
                   help="collect the prefix shared by cached(remote=URL) instead: parts no "
                        "current generation names, out of use for --older-than DAYS "
                        "(required), old leases and probes; never a manifest or a part in use")


def _add_preview(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """The ``preview`` command's arguments."""
    p = sub.add_parser("preview", help="draw a PNG contact sheet of vectors with their paths",
                       formatter_class=fmt,
                       description="Draw random (or given) entries as images, upscaled with "
                       "nearest-neighbour, each captioned with its file name and directory: look "
                       "at it to see that every vector is the right image.",
                       epilog="examples:\n  tensorstore-cache preview covers.tsc --out grid.png\n"
                       "  tensorstore-cache preview covers.tsc --out g.png --paths a.jpg b.jpg\n"
                       "  tensorstore-cache preview covers.tsc --out g.png --paths @paths.txt")
    p.add_argument("store", metavar="STORE")
    p.add_argument("--out", required=True, metavar="PNG", help="the PNG file to write")
    p.add_argument("--n", type=_positive_int, default=64, help="random entries to draw (default: 64)")
    p.add_argument("--paths", nargs="+", default=None, metavar="PATH",
                   help="draw these entries, in this order, instead of random ones")
    p.add_argument("--seed", type=int, default=None, help="seed of the random choice")
    p.add_argument("--scale", type=_positive_int, default=None,
                   help="upscaling factor (default: tiles of about 96 px)")
    p.add_argument("--columns", type=_positive_int, default=None, help="tiles per row")
