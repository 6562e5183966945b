"""Device workers: the processes that run a batch loader, one per distinct device.

A :class:`~tensorstore_cache.loaders.BatchLoader` is not sent to the build's
CPU workers: they run ``prepare`` on their keys and send the prepared items,
a batch at a time, to a device worker. Device workers are workers of a
:class:`~.pool.BuildPool` of their own (started by
:func:`~.batched.device_workers` from a clean interpreter, so CUDA works in
them; joined, or killed after a while, before the build returns), each of which sets
the loader's ``device``, calls its ``setup`` once and then serves batches
until the builder says stop. The calling process never unpickles the
loader's model: it imports nothing the loader's ``setup`` imports.

A device worker listens on a Unix socket (:mod:`multiprocessing.connection`,
authenticated by a key only the build's processes know). Every connection
has a reader thread that authenticates it (so a client that connects and
then stalls holds up no other) and queues its requests; the worker computes them one
at a time, in the order they came, and answers each on its connection. A
CPU worker keeps one batch queued behind the one computing, so the device
does not wait for ``prepare``.

A device worker that served its build to the end skips the interpreter's
final teardown, which for a framework such as torch takes about a second
that the build would wait for (:func:`exit_quickly`): the ``atexit``
handlers still run (the loader's, its framework's, logging's), the file
objects left open are closed (as the teardown would), and then the process
exits at once. One that failed exits as usual.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import logging
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import (
    Client,
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from typing import Any

from ..errors import BuildError
from ..loaders import BatchLoader
from .frames import loader_frames

__all__ = ["DeviceStage", "exit_quickly", "keep_freed_memory", "serve", "wait_listening"]

#: How long the builder waits for its device workers to listen (seconds).
START_TIMEOUT_S = 600.0
#: Seconds a connection is retried while a listening device worker's socket is not ready.
CONNECT_RETRY_S = 5.0


@dataclass(slots=True)
class DeviceStage:
    """What the CPU workers of a batched build run: ``prepare`` here, the loader on a device.

    Sent to every CPU worker (pickled with ``prepare``, not the loader). Each
    process opens its own connection to a device worker when it first sends
    it a batch.
    """

    prepare: Callable[[str], Any] | None
    """The per-key stage run in the CPU workers (None: the items are the keys)."""
    batch_size: int
    """Items per batch (fewer at the end of a shard)."""
    devices: tuple[str, ...]
    """The distinct devices, one worker each."""
    addresses: tuple[str, ...]
    """Each device worker's socket."""
    authkey: bytes
    """The key a connection proves it belongs to this build with."""
    _conns: dict[int, Connection] = field(default_factory=dict)
    _started: Callable[[], None] | None = None
    """In the building process: waits until every device worker listens (called before the
    first connection, so that the first batch is prepared while they start)."""

    def __getstate__(self) -> dict[str, Any]:
        return {"prepare": self.prepare, "batch_size": self.batch_size,
                "devices": self.devices, "addresses": self.addresses, "authkey": self.authkey}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_conns", {})
        object.__setattr__(self, "_started", None)

    def device_of(self, k: int) -> int:
        """The device worker of shard task ``k`` (shards go round the devices)."""
        return k % len(self.devices)

    def send(self, d: int, items: list[Any]) -> None:
        """Queue a batch of ``items`` on device worker ``d``."""
        try:
            self._conn(d).send(items)
        except (OSError, EOFError) as exc:
            raise self._died(d, exc) from None

    def receive(self, d: int) -> tuple[str, Any, str]:
        """The answer to the oldest batch queued on device worker ``d``:
        ``("ok", result, "")`` or ``("error", "Type: message", the loader's frames)``.

        Raises
        ------
        BuildError
            If the device worker's ``setup`` failed, or the worker died.
        """
        try:
            kind, value, frames = self._conn(d).recv()
        except (OSError, EOFError) as exc:
            raise self._died(d, exc) from None
        if kind == "setup":
            raise BuildError(
                f"the batch loader's setup({self.devices[d]!r}) failed in its device worker, "
                f"so nothing was published: {value}" + (f"\n{frames}" if frames else "")
            )
        return kind, value, frames

    def ready(self, d: int) -> bool:
        """Whether device worker ``d`` has answered a batch (the answer waits to be received)."""
        try:
            return self._conn(d).poll()
        except (OSError, EOFError):
            return True  # receive() says what happened

    def stop(self) -> None:
        """Tell every device worker to stop once it has answered what it was sent."""
        for d, address in enumerate(self.addresses):
            try:
                with Client(address, family="AF_UNIX", authkey=self.authkey) as conn:
                    conn.send(None)
            except (OSError, EOFError) as exc:
                raise self._died(d, exc) from None

    def close(self) -> None:
        """Close this process's connections."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def wait_started(self) -> None:
        """In the building process: wait until every device worker listens (once; before
        any CPU worker may connect)."""
        if self._started is not None:
            started, self._started = self._started, None
            started()

    def _conn(self, d: int) -> Connection:
        conn = self._conns.get(d)
        if conn is None:
            self.wait_started()
            deadline = time.monotonic() + CONNECT_RETRY_S
            while True:  # a listener's socket file exists a moment before it listens
                try:
                    conn = Client(self.addresses[d], family="AF_UNIX", authkey=self.authkey)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            self._conns[d] = conn
        return conn

    def _died(self, d: int, exc: BaseException) -> BuildError:
        self._conns.pop(d, None)
        return BuildError(
            f"the device worker of {self.devices[d]!r} stopped answering "
            f"({type(exc).__name__}: {exc}), so nothing was published; it died (out of memory, "
            "a crash in native code, killed) or could not start"
        )


def _as_numpy(value: Any) -> Any:
    """A batch's result with tensors of any framework as NumPy arrays (a dict: each field)."""
    if isinstance(value, dict):
        return {name: _as_numpy(v) for name, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_as_numpy(v) for v in value]
        return items if type(value) is list else tuple(items)  # namedtuples too
    detach = getattr(value, "detach", None)
    if callable(detach):  # a torch tensor, possibly on a GPU: bring it home
        return detach().cpu().numpy()
    return value


#: Set in a device worker once it has served its build to the end (see :func:`exit_quickly`).
_served: list[bool] = []


def _inner(obj: Any) -> list[Any]:
    """What a file object holds (a wrapper's wrapped file among them)."""
    held = gc.get_referents(obj)
    return held + [v for d in held if isinstance(d, dict) for v in d.values()]


def _depth(obj: Any) -> tuple[bool, bool]:
    """How deep a file object of a wrapping cycle sits, by its type (lower: close it first):
    a raw stream last, then io's own buffers, a Python-level wrapper (a GzipFile) first."""
    kind = type(obj)
    return issubclass(kind, io.RawIOBase), kind.__module__ in ("_io", "io")


def exit_quickly() -> None:
    """At exit, once this device worker has served its build: finish what the teardown would,
    then exit without it.

    Registered with :mod:`atexit` before the worker unpickles its loader, so
    that it runs after every handler registered since (the loader's, its
    framework's); it runs those registered before it that matter itself
    (logging's, :class:`weakref.finalize`'s), then closes the file objects
    left open, each wrapper before the file it wraps (a ``GzipFile`` before
    its file, text before its buffer), as collecting them would, and exits
    with status 0 (:func:`os._exit`). A worker that failed exits as usual.
    """
    if not _served:
        return
    with contextlib.suppress(Exception):
        logging.shutdown()
    with contextlib.suppress(Exception):
        weakref.finalize._exitfunc()  # type: ignore[attr-defined]
    # by type, never an object's own attributes (some warn when looked at): io's classes,
    # and every file class built on them, derive from its C base
    base = io.IOBase.__mro__[1]
    objects = gc.get_objects()
    kinds = {kind for kind in {type(obj) for obj in objects} if base in kind.__mro__}
    files = {id(obj): obj for obj in objects if type(obj) in kinds}
    std = [s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None]
    keep = {id(s) for s in std} | {id(getattr(s, "buffer", None)) for s in std}
    keep |= {id(getattr(getattr(s, "buffer", None), "raw", None)) for s in std}
    wraps = {i: {id(x) for x in _inner(f) if id(x) in files and id(x) != i}
             for i, f in files.items()}
    left = set(files)
    while left:  # the outermost first: no file left wraps them
        wrapped = {j for i in left for j in wraps[i]}
        # a cycle (since Python 3.12 a GzipFile being written, its buffer and the raw stream
        # under it hold each other): the wrapper of the three first, one at a time
        outer = [i for i in left if i not in wrapped] or [min(left, key=lambda i: _depth(files[i]))]
        for i in outer:
            left.discard(i)
            with contextlib.suppress(Exception):
                if not files[i].closed:
                    files[i].flush()
                    if i not in keep:
                        files[i].close()
    os._exit(0)


#: Blocks up to this size a device worker's glibc allocator serves from its heap, and free
#: memory it keeps at the heap's top (see :func:`keep_freed_memory`).
KEEP_FREED_BYTES = 1 << 30
#: The largest mmap threshold glibc before 2.35 accepts (half its heap's largest size).
OLD_GLIBC_MMAP_MAX = 32 << 20
#: What glibc's ``mallopt`` calls them (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Environment variables by which a user sets glibc's allocator up themselves.
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                    "MALLOC_MMAP_MAX_")


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> int:
    """In a device worker: have glibc's allocator keep the memory it frees for the next batch.

    With glibc's defaults, a block larger than 32 MiB (and any block, once
    the adaptive threshold is off) is mapped when allocated and unmapped
    when freed, and a model's activations are faulted in page by page at
    every batch: this sets the mmap threshold and the trim threshold to
    :data:`KEEP_FREED_BYTES` (the mmap threshold to :data:`OLD_GLIBC_MMAP_MAX`
    where glibc refuses more), by ``mallopt`` in this process only, so that
    no process the loader starts inherits it. It does nothing if the
    environment sets the allocator up (:data:`MALLOC_VARIABLES`, a
    ``glibc.malloc`` tunable, or an allocator in ``LD_PRELOAD`` such as
    jemalloc), or the C library is not glibc.

    Parameters
    ----------
    environ
        The environment to look at (default: this process's).

    Returns
    -------
    int
        The mmap threshold set, in bytes; 0 if nothing was changed.
    """
    env = os.environ if environ is None else environ
    if (any(name in env for name in MALLOC_VARIABLES)
            or "glibc.malloc" in env.get("GLIBC_TUNABLES", "")
            or "malloc" in env.get("LD_PRELOAD", "")):
        return 0
    try:
        if not str(os.confstr("CS_GNU_LIBC_VERSION")).startswith("glibc "):
            return 0
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return 0
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    for threshold in (KEEP_FREED_BYTES, OLD_GLIBC_MMAP_MAX):
        if mallopt(_M_MMAP_THRESHOLD, threshold) == 1:
            # only with the mmap threshold set: the trim threshold alone turns off the
            # adaptive mmap threshold, and every block over 128 KiB is mapped again
            mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
            return threshold
    return 0


def serve(loader: Any, device: str, address: str, authkey: bytes) -> None:
    """In a device worker: set the loader up on ``device``, then compute the batches sent to
    ``address`` until a connection sends ``None``."""
    # authenticated in each connection's own thread, not in accept(): a client
    # that connects and then stalls must not keep every other one waiting
    listener = Listener(address, family="AF_UNIX")
    requests: queue.Queue[tuple[Connection, Any]] = queue.Queue()

    def read(conn: Connection) -> None:
        try:  # what Listener(authkey=...).accept() does, in the same order
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        except Exception:  # a connection that failed authentication or went away: drop it
            conn.close()
            return
        while True:
            try:
                message = conn.recv()
            except (OSError, EOFError):
                return
            requests.put((conn, message))

    def accept() -> None:
        while True:
            try:
                conn = listener.accept()
            except OSError:
                return
            threading.Thread(target=read, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, name="tsc-device-accept", daemon=True).start()
    failed: tuple[str, str] | None = None
    try:
        if not isinstance(loader, BatchLoader):
            raise TypeError(f"{loader!r} is not a tensorstore_cache.BatchLoader")
        loader.device = device
        loader.setup(device)
    except Exception as exc:
        failed = (f"{type(exc).__name__}: {exc}", loader_frames(exc))
    try:
        while True:
            conn, items = requests.get()
            if items is None:
                break
            if failed is not None:
                reply: tuple[str, Any, str] = ("setup", *failed)
            else:
                try:
                    reply = ("ok", _as_numpy(loader(items)), "")
                except Exception as exc:  # the CPU worker retries the batch key by key
                    reply = ("error", f"{type(exc).__name__}: {exc}", loader_frames(exc))
            try:
                conn.send(reply)
            except OSError:
                pass  # the CPU worker is gone: its builder reports why
            except Exception as exc:  # the result does not pickle: say so, never leave it waiting
                with contextlib.suppress(OSError):
                    conn.send(("error", f"the batch's result cannot be sent back to the build "
                               f"({type(exc).__name__}: {exc}); return arrays or a dict of "
                               "arrays", ""))
        if failed is None:
            _served.append(True)
    finally:
        listener.close()


def wait_listening(
    futures: list[Future[None]], addresses: tuple[str, ...], devices: tuple[str, ...]
) -> None:
    """Wait until every device worker listens at its address, or raise why one never will."""
    deadline = time.monotonic() + START_TIMEOUT_S
    for future, address, device in zip(futures, addresses, devices, strict=True):
        while not os.path.exists(address):
            if future.done():
                exc = future.exception()
                raise BuildError(
                    f"the device worker of {device!r} could not start, so nothing was "
                    f"published: {type(exc).__name__}: {exc}\nA loader that can be imported by "
                    "name is sent to it by reference: its module must import in a fresh Python "
                    "process (installed, or on sys.path) and must not fail at import"
                )
            if time.monotonic() > deadline:
                raise BuildError(
                    f"the device worker of {device!r} did not start within "
                    f"{START_TIMEOUT_S:.0f} s; nothing was published"
                )
            time.sleep(0.01)
