"""The ``tensorstore-cache`` command (also ``python -m tensorstore_cache``).

Exit status: 0 success; 1 the operation failed (sources that cannot be
loaded, a store that is missing or damaged); 2 the command line is wrong
(unknown option, bad value, a source that does not exist or holds no paths).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from .. import config
from .._api import build_store, open_store, verify_store
from ..cache import gc, list_caches
from ..errors import (
    BuildError,
    KeyNotInStoreError,
    StoreExistsError,
    StoreNotFoundError,
    TensorStoreCacheError,
)
from ..fs import age_text, disk_usage
from ..remote import redact
from .parser import PROG, build_parser, parse_size

__all__ = ["main", "parse_size"]

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"})


class UsageError(Exception):
    """A wrong command line detected after parsing (exit status 2)."""


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


# -- sources ------------------------------------------------------------------------


def find_images(root: Path) -> list[str]:
    """Every image file under ``root`` (recursively), sorted."""
    found = [
        str(p) for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    ]
    return sorted(found)


def _read_table_column(source: Path, column: str) -> list[str]:
    if source.suffix.lower() in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq  # type: ignore[import-untyped]
        except ImportError:
            raise UsageError(
                f"reading {source} needs pyarrow: pip install 'tensorstore_cache[pandas]'"
            ) from None
        names = pq.read_schema(source).names
        if column not in names:
            raise UsageError(f"{source} has no column {column!r}; its columns: {', '.join(names)}")
        values = pq.read_table(source, columns=[column]).column(column).to_pylist()
    else:
        delimiter = "\t" if source.suffix.lower() == ".tsv" else ","
        with open(source, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter=delimiter)
            names = list(reader.fieldnames or [])
            if column not in names:
                raise UsageError(
                    f"{source} has no column {column!r}; its columns: {', '.join(names) or '(none)'}"
                )
            values = [row[column] for row in reader]
    return [str(v) for v in values if v not in (None, "")]


def read_sources(source: str, column: str) -> list[str]:
    """Paths named by SOURCE: a directory, a CSV/TSV/Parquet table, a list file, or ``-``."""
    if source == "-":
        return [line.strip() for line in sys.stdin if line.strip() and not line.startswith("#")]
    path = Path(source)
    if path.is_dir():
        return find_images(path)
    if not path.exists():
        raise UsageError(f"source {source!r} does not exist (give a directory, a CSV/Parquet file or a list of paths)")
    if path.suffix.lower() in (".csv", ".tsv", ".parquet", ".pq"):
        return _read_table_column(path, column)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


# -- commands -----------------------------------------------------------------------


def cmd_build(args: argparse.Namespace) -> int:
    paths = read_sources(args.source, args.column)
    if not paths:
        what = "image files" if Path(args.source).is_dir() else "paths"
        raise UsageError(f"no {what} found in {args.source!r}")
    t0 = time.perf_counter()
    store = build_store(
        paths,
        args.out,
        size=tuple(args.size),
        dtype=args.dtype,
        workers=args.workers,
        on_error=args.on_error,
        progress=not args.quiet,
        overwrite=args.overwrite,
    )
    dt = time.perf_counter() - t0
    with store:
        spec = store.spec
        shape = "x".join(str(d) for d in spec.item_shape or ())
        print(
            f"built {store.location}: {len(store):,} vectors {shape} {spec.dtype} "
            f"({_human(disk_usage(Path(store.location)))}) in {dt:.1f} s "
            f"({len(paths) / max(dt, 1e-9):,.0f} items/s)"
        )
        if spec.skipped:
            print(f"skipped {len(spec.skipped)} source(s) that could not be loaded:", file=sys.stderr)
            for p, reason in spec.skipped[:10]:
                print(f"  {p}: {reason}", file=sys.stderr)
            if len(spec.skipped) > 10:
                print(f"  ... and {len(spec.skipped) - 10} more (tensorstore-cache info --json)", file=sys.stderr)
    return 0


def store_info(location: str) -> dict[str, Any]:
    """What ``info`` shows, as JSON values.

    A store of records lists its fields (``fields``) with their dtype and
    shape; a ragged or text field also with the ``min``, ``median`` and
    ``max`` of its rows' lengths (``lengths``: the first varying dimension;
    bytes for text), read from its offsets alone.
    """
    with open_store(location) as store:
        spec = store.spec
        info = spec.to_json()
        info.update(
            location=store.location,
            entries=len(store),
            item_nbytes=spec.item_nbytes,
            disk_bytes=disk_usage(Path(store.location)),
            created=datetime.fromtimestamp(spec.created_unix, UTC).isoformat(timespec="seconds"),
        )
        for field in info.get("fields", []):
            if field["kind"] != "fixed":
                lengths = store.lengths(field["name"])
                field["lengths"] = {
                    "min": int(lengths.min()) if len(lengths) else 0,
                    "median": float(np.median(lengths)) if len(lengths) else 0.0,
                    "max": int(lengths.max()) if len(lengths) else 0,
                }
    return info


def _field_line(field: dict[str, Any]) -> str:
    """One field of a store of records, as ``info`` prints it."""
    if field["kind"] == "fixed":
        shape = " x ".join(str(d) for d in field["shape"]) or "scalar"
        return f"fixed   {shape} {field['dtype']}"
    stats = field["lengths"]
    median = f"{stats['median']:g}"
    if field["kind"] == "text":
        return f"text    UTF-8, {stats['min']} / {median} / {stats['max']} bytes (min / median / max)"
    shape = " x ".join("*" if d is None else str(d) for d in field["shape"])
    return (f"ragged  {shape} {field['dtype']}, length {stats['min']} / {median} / "
            f"{stats['max']} (min / median / max)")


def cmd_info(args: argparse.Namespace) -> int:
    info = store_info(args.store)
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
        return 0
    params = ", ".join(f"{k}={v}" for k, v in info["loader_params"].items())
    rows = [("store", info["location"]), ("entries", f"{info['entries']:,}")]
    if "fields" in info:
        fields = info["fields"]
        rows.append(("record", f"{len(fields)} field(s): {_human(info['item_nbytes'])} fixed a "
                               "record, plus ragged values"))
        width = max(len(f["name"]) for f in fields)
        rows.extend((f"  {f['name']:<{width}}", _field_line(f)) for f in fields)
    else:
        shape = " x ".join(str(d) for d in info["item_shape"])
        rows.append(("vector", f"{shape} {info['dtype']} ({_human(info['item_nbytes'])} each)"))
    rows += [
        ("loader", f"{info['loader_id']}" + (f" ({params})" if params else "")),
        ("on disk", _human(info["disk_bytes"])),
        ("built", info["created"].replace("T", " ")),
        ("format", f"zarr v3 group, tensorstore_cache format {info['format_version']}, "
                   f"{info['rows_per_shard']:,} rows per shard"),
    ]
    if info["skipped"]:
        first = info["skipped"][0]
        rows.append(("skipped", f"{len(info['skipped'])} source(s), e.g. {first[0]}: {first[1]}"))
    width = max(9, *(len(key) for key, _v in rows))
    for key, value in rows:
        print(f"{key:<{width}} {value}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    if not args.quiet:
        print(f"verifying {args.store} ...", file=sys.stderr)
    t0 = time.perf_counter()
    report = verify_store(args.store)
    dt = time.perf_counter() - t0
    if report.ok:
        print(f"{report} in {dt:.1f} s")
        return 0
    print(str(report), file=sys.stderr)
    print("The store cannot be trusted: delete it and build it again.", file=sys.stderr)
    return 1


def _ls_remote(url: str, as_json: bool) -> int:
    try:
        caches = list_caches(remote=url)
    except ValueError as exc:  # a URL of a store that cannot be shared
        raise UsageError(str(exc)) from None
    if as_json:
        json.dump([dataclasses.asdict(c) for c in caches], sys.stdout, indent=2)
        print()
        return 0
    if not caches:
        print(f"no caches under {redact(url)}")
        return 0
    table = [("NAMESPACE", "GENERATION", "PARTS", "OBJECTS", "SIZE", "LEASE")]
    for c in caches:
        lease = "-" if c.lease is None else f"{c.lease}, written {age_text(c.lease_age or 0)} ago"
        table.append((_printable(c.namespace), f"{c.generation} of {c.generations}",
                      str(c.parts), str(c.objects), _human(c.bytes), _printable(lease)))
    _print_table(table)
    print(f"{len(caches)} cache(s) under {redact(url)}")
    return 0


def _print_table(table: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cmd_ls(args: argparse.Namespace) -> int:
    if args.remote is not None:
        return _ls_remote(args.remote, args.json)
    caches = list_caches(args.cache_dir, share_with=args.share_with)
    if args.json:
        out = []
        for c in caches:
            d = dataclasses.asdict(c)
            d["last_used"] = c.last_used.isoformat(timespec="seconds")
            out.append(d)
        json.dump(out, sys.stdout, indent=2, default=list)
        print()
        return 0
    if not caches:
        print(f"no caches in {config.cache_root(args.cache_dir)}")
        return 0
    now = datetime.now(UTC)
    table = [("NAMESPACE", "OWNER", "MODE", "LOADER", "VECTOR", "ENTRIES", "SIZE", "LAST USED", "")]
    for c in caches:
        shape = "x".join(str(d) for d in c.item_shape) if c.item_shape else "-"
        vector = f"record({', '.join(c.fields)})" if c.fields else f"{shape} {c.dtype}"
        note = f"REFUSED: {c.refused}" if c.refused else ""
        if c.building:
            note = f"{note}; building: {c.building}" if note else f"building: {c.building}"
        table.append((
            _printable(c.namespace),
            f"{c.owner}:{c.group}",
            c.mode,
            _printable(c.loader_id),
            _printable(vector),
            f"{c.entries:,}",
            _human(c.bytes),
            f"{age_text((now - c.last_used).total_seconds())} ago",
            _printable(note),
        ))
    _print_table(table)
    total = sum(c.bytes for c in caches)
    print(f"{len(caches)} cache(s), {_human(total)} in {caches[0].path.rsplit('/', 1)[0]}")
    refused = sum(1 for c in caches if c.refused)
    if refused:
        how = "" if args.share_with else " (or --share-with GROUP for a shared cache)"
        print(f"{refused} cache(s) marked REFUSED would be refused by cached(): someone else "
              f"owns or can write them; see --json for how to fix each{how}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    if args.remote is not None and (args.older_than is None or args.max_size is not None):
        raise UsageError("gc --remote collects by age only: give --older-than DAYS (parts out "
                         "of use that long go), without --max-size")
    with _warnings_to_stderr():  # what gc kept of other users' files, and why
        removed = gc(
            args.cache_dir,
            older_than=None if args.older_than is None else args.older_than * 86400.0,
            max_bytes=args.max_size,
            dry_run=args.dry_run,
            share_with=args.share_with,
            all_users=args.all_users,
            remote=args.remote,
        )
    verb = "would remove" if args.dry_run else "removed"
    for r in removed:
        print(f"{verb} {r.kind} {r.path} ({_human(r.bytes)}): {r.reason}")
    freed = sum(r.bytes for r in removed)
    print(f"{verb} {len(removed)} item(s), {_human(freed)}" + (" (dry run)" if args.dry_run else ""))
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    from .preview import contact_sheet, pick_rows

    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise UsageError(f"--out must name a .png file, got {args.out!r}")
    with open_store(args.store) as store:
        if len(store) == 0:
            raise TensorStoreCacheError(f"{args.store} is empty: nothing to preview")
        rows = pick_rows(store, args.paths, n=args.n, seed=args.seed)
        try:
            sheet = contact_sheet(store, rows, scale=args.scale, columns=args.columns)
        except ValueError as exc:
            raise TensorStoreCacheError(str(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out, format="PNG")
    print(f"wrote {out}: {len(rows)} entries of {args.store} ({sheet.width} x {sheet.height} px)")
    return 0


#: What each command of :func:`~.parser.build_parser` runs.
_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "build": cmd_build, "info": cmd_info, "verify": cmd_verify, "ls": cmd_ls, "gc": cmd_gc,
    "preview": cmd_preview,
}


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """Print the library's logged warnings on stderr, one line each, while the block runs."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"{PROG}: warning: %(message)s"))
    log = logging.getLogger("tensorstore_cache")
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)


def _printable(text: str) -> str:
    """``text`` without control characters (names in a shared cache are anyone's)."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tensorstore-cache`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
    func: Callable[[argparse.Namespace], int] = _COMMANDS[args.command]
    try:
        return func(args)
    except UsageError as exc:
        return _fail(str(exc), 2)
    except BuildError as exc:  # the library's advice, in this command's words
        return _fail(str(exc).replace("pass on_error='skip'", "pass --on-error skip"), 1)
    except StoreExistsError as exc:
        if args.command == "build":
            return _fail(f"{args.out!r} already exists; use --overwrite to replace it", 1)
        return _fail(str(exc), 1)
    except StoreNotFoundError as exc:
        store = getattr(args, "store", None)
        if store is not None and not Path(store).exists():
            return _fail(f"no store at {store!r} (build one with: {PROG} build SOURCE --out {store})", 1)
        return _fail(str(exc), 1)
    except KeyNotInStoreError as exc:
        shown = ", ".join(repr(m) for m in exc.missing[:5])
        more = f" and {len(exc.missing) - 5} more" if len(exc.missing) > 5 else ""
        return _fail(f"{len(exc.missing)} path(s) not in the store: {shown}{more}", 1)
    except BrokenPipeError:  # e.g. `tensorstore-cache info --json x | head`
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (TensorStoreCacheError, OSError) as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
