"""What the CPU workers of a batched build run: ``prepare`` here, the batch loader on a device.

A shard task of a batched build (or the building process, for the first
batches) prepares its keys in key order, sends them to its device worker
``batch_size`` at a time (the last batch of a shard may be shorter), keeps
one batch queued behind the one computing, and splits every result into
rows (:func:`~.results.batch_rows`). A batch whose call raises is sent again
key by key, so that every failing key is named and ``on_error="skip"``
skips only those.

Each process opens its own connection to a device worker (a Unix socket,
:mod:`multiprocessing.connection`, authenticated by a key only the build's
processes know) when it first sends it a batch; the worker answers a
connection's batches in the order they came.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection
from typing import Any

from ...errors import BuildError
from ..frames import loader_frames
from ..tasks import BatchStage, Failure, Row
from .results import batch_rows, prepared_nbytes

__all__ = ["BatchRun", "DeviceStage"]

#: Seconds a connection is retried while a listening device worker's socket is not ready.
CONNECT_RETRY_S = 5.0


@dataclass(slots=True)
class DeviceStage(BatchStage):
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

    def rows(
        self, keys: list[str], k: int, check: Callable[[str, Any], Any],
        names: tuple[str, ...] | None,
    ) -> list[Row]:
        """The rows of ``keys`` of shard task ``k``, computed on its device worker (shards go
        round the devices) in batches (see :class:`BatchRun`).

        Parameters
        ----------
        keys
            The keys, in row order.
        k
            The shard task's number.
        check
            Checks each value: ``check(key, value)`` returns what is stored.
        names
            The field names of a loader's tuples, in order.
        """
        run = BatchRun(self, keys, k % len(self.devices), check, names)
        run.send()
        return run.finish()

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

    def connect_after(self, started: Callable[[], None]) -> None:
        """In the building process: have the first connection call ``started`` first (it
        waits until every device worker listens)."""
        self._started = started

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


class BatchRun:
    """The rows of ``keys`` computed in batches on device worker ``device``, in key order:
    each its value, checked by ``check(key, value)``, or a :class:`~..tasks.Failure` (of
    ``prepare``, of the loader on the key alone, or of ``check``).

    :meth:`send` prepares the keys and sends them ``stage.batch_size`` at a
    time; up to ``depth`` batches stay queued behind the one computing (with
    ``max_bytes``, fewer if the first batch's items say that so many would
    hold more bytes), and every answer is taken as soon as it is there. :meth:`finish` takes the
    answers still due (this process's connection answers in the order it
    asked: nothing else may be sent to that device worker from this process
    in between) and returns the rows. ``names`` orders the fields of a
    loader's tuples.
    """

    def __init__(
        self, stage: DeviceStage, keys: list[str], device: int,
        check: Callable[[str, Any], Any], names: tuple[str, ...] | None = None,
        *, depth: int = 1, max_bytes: int | None = None,
    ) -> None:
        self.stage, self.keys, self.device = stage, keys, device
        self.check, self.names, self.depth = check, names, depth
        self.max_bytes = max_bytes
        self.out: list[Row] = [None] * len(keys)
        self.sent = 0
        """How many keys (from the first) were prepared and sent (or failed to prepare)."""
        self._queued: list[tuple[list[int], list[Any]]] = []  # batches sent, oldest first
        self._retry: list[tuple[int, Any]] = []

    def send(self, enough: Callable[[], bool] | None = None,
             before: Callable[[int], None] | None = None) -> None:
        """Prepare and send every key, or, with ``enough``, stop preparing once it returns
        true (checked as answers come; :attr:`sent` says how many were). ``before(i)`` runs
        just before key ``i`` is prepared (to take its source's identity before it is
        read)."""
        stage = self.stage
        rows: list[int] = []
        items: list[Any] = []
        for i in range(self.sent, len(self.keys)):
            if enough is not None and enough():
                break
            self.sent = i + 1
            if before is not None:
                before(i)
            key = self.keys[i]
            try:
                items.append(key if stage.prepare is None else stage.prepare(key))
            except Exception as exc:
                self.out[i] = Failure(f"{type(exc).__name__}: {exc}", loader_frames(exc))
                continue
            rows.append(i)
            if len(rows) == stage.batch_size:
                self._send(rows, items)
                rows, items = [], []
        if rows:
            self._send(rows, items)

    def take(self) -> bool:
        """Take the oldest answer due (waiting for it); False if none is due."""
        if not self._queued:
            return False
        self._finish(*self._queued.pop(0))
        return True

    def finish(self) -> list[Row]:
        """Take every answer still due, send the keys of failed batches again one by one;
        the rows of the keys sent."""
        while self.take():
            pass
        for i, item in self._retry:  # key by key, so that each failure is named
            self.stage.send(self.device, [item])
            self._finish([i], [item])
        self._retry.clear()
        return self.out[: self.sent]

    def _send(self, rows: list[int], items: list[Any]) -> None:
        if self.max_bytes is not None:  # the first batch tells what a batch weighs
            per_batch = max(1, sum(prepared_nbytes(item) for item in items))
            self.depth = max(0, min(self.depth, self.max_bytes // per_batch - 1))
            self.max_bytes = None
        self.stage.send(self.device, items)
        self._queued.append((rows, items))
        while self._queued and (len(self._queued) > self.depth + 1
                                or self.stage.ready(self.device)):
            self._finish(*self._queued.pop(0))

    def _finish(self, rows: list[int], items: list[Any]) -> None:
        kind, result, frames = self.stage.receive(self.device)
        if kind != "ok":
            if len(rows) == 1:
                self.out[rows[0]] = Failure(result, frames)
            else:
                self._retry.extend(zip(rows, items, strict=True))
            return
        values = batch_rows(result, len(rows), self.keys[rows[0]], self.names)
        for i, value in zip(rows, values, strict=True):
            try:
                self.out[i] = self.check(self.keys[i], value)
            except Exception as exc:
                self.out[i] = Failure(f"{type(exc).__name__}: {exc}", "")
