"""A device worker: the batch loader set up on its device, serving batches until told to stop.

Device workers are workers of a :class:`~..pool.BuildPool` of their own
(started by :func:`~.launch.device_workers` from a clean interpreter, so CUDA
works in them), each of which sets the loader's ``device``, calls its
``setup`` once and then serves batches until the builder says stop. The
building process never unpickles the loader's model: it imports nothing the
loader's ``setup`` imports.

A device worker listens on a Unix socket (:mod:`multiprocessing.connection`,
authenticated by a key only the build's processes know). Every connection
has a reader thread that authenticates it (so a client that connects and
then stalls holds up no other) and queues its requests; the worker computes
them one at a time, in the order they came, and answers each on its
connection (:class:`~.stage.DeviceStage` is the other end).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from multiprocessing.connection import (
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from typing import Any

from ...loaders import BatchLoader
from ..frames import loader_frames
from ..quick_exit import served
from .environment import keep_freed_memory
from .results import as_numpy

__all__ = ["device_worker_setup", "serve"]


def device_worker_setup() -> None:
    """A device worker's set-up, before it unpickles its loader: it keeps the memory it frees
    (:func:`~.environment.keep_freed_memory`). (Like every worker of a pool, it exits
    without the interpreter's teardown once it has served its build:
    :func:`~..quick_exit.exit_quickly`.)"""
    keep_freed_memory()


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
                    reply = ("ok", as_numpy(loader(items)), "")
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
            served()
    finally:
        listener.close()
