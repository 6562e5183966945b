"""A real S3 API (moto) on the loopback interface that counts what it serves.

Every request is logged server side as ``(method, key, status, bytes sent)``
so tests and benchmarks can tell exactly what a reader fetched. A response
can be made to stall part-way (``stall``), as a slow or dying network would.

Conditional writes (``If-None-Match``/``If-Match``) are serialised per key: moto
checks the condition and then writes without a lock, so two threaded requests
could both win. Faults are injected on request (:class:`Fault`, ``POST
/_tsc/faults``): a lost response (the write is applied, the client is told 500
and retries), a late one (``late``: the write is applied and its answer held until the
client, having given up waiting, sends the request again; a client still waiting after
``seconds`` has its connection closed without an answer), ``409
ConditionalRequestConflict``, ``403 AccessDenied`` (``denied``), ``503 SlowDown``, a
stall before the request is served, and a server that ignores conditional headers.

Run standalone (``python -m benchmarks.common.s3server``, as :class:`S3Process` does:
then the server does not share the reader's GIL) it prints its port and serves
``GET /_tsc/log`` (the log as JSON), ``POST /_tsc/reset``, ``POST /_tsc/stall`` and
``POST /_tsc/faults``.
Used by the tests of remote stores and by ``benchmarks/remote/remote.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CountingS3", "Fault", "Request", "S3Process"]

#: The faults a :class:`Fault` can inject.
FAULT_KINDS = ("lost", "conflict", "slowdown", "stall", "ignore_conditions", "denied", "late")


@dataclass
class Fault:
    """Inject ``kind`` into the next ``count`` requests (-1: every one) of ``method`` whose
    key contains ``match`` (and, if ``access_key`` is given, signed with that access key id:
    ``denied`` answers them 403 ``AccessDenied``, as a bucket policy does to read-only
    credentials)."""

    kind: str
    match: str = ""
    method: str = "PUT"
    count: int = 1
    seconds: float = 0.0
    access_key: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; one of {FAULT_KINDS}")


def _error(code: int, name: str, message: str) -> tuple[str, bytes]:
    reason = {403: "Forbidden", 409: "Conflict", 500: "Internal Server Error",
              503: "Slow Down"}[code]
    body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{name}</Code>'
            f"<Message>{message}</Message></Error>").encode()
    return f"{code} {reason}", body


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    key: str  # "bucket/path/in/bucket"
    status: int
    sent: int
    range: str | None
    started: float = 0.0  # time.monotonic() (system-wide on Linux): when it arrived
    ended: float = 0.0  # and when its last byte was sent


@dataclass
class CountingS3:
    host: str = "127.0.0.1"
    port: int = 0
    log: list[Request] = field(default_factory=list)
    stalls: dict[str, tuple[int, float]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)  # "METHOD key" of requests held by a stall
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _key_locks: dict[str, threading.Lock] = field(default_factory=dict)
    _busy: int = 0
    _arrived: dict[str, int] = field(default_factory=dict)  # requests per "METHOD key"
    _arrival: threading.Condition = field(default_factory=threading.Condition)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every request being served has finished (and is logged)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._busy == 0:
                    return
            time.sleep(0.005)

    def start(self) -> CountingS3:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(self.host, self.port, self._wrap(app), threaded=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(10)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def storage_options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def reset(self) -> None:
        """Forget every request served so far, once those being served are logged (a client
        may have its whole answer before the server has finished the request)."""
        self.settle()
        with self._lock:
            self.log.clear()

    def requests(self, method: str = "GET", under: str = "") -> list[Request]:
        self.settle()
        with self._lock:
            return [r for r in self.log if r.method == method and r.key.startswith(under)]

    def _record(self, r: Request) -> None:
        with self._lock:
            self.log.append(r)

    def _wrap(self, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = urllib.parse.unquote(environ.get("PATH_INFO", ""))
            if path == "/_tsc/log":
                self.settle()
                with self._lock:
                    body = json.dumps([{"method": r.method, "key": r.key, "status": r.status,
                                        "sent": r.sent, "range": r.range, "started": r.started,
                                        "ended": r.ended} for r in self.log]).encode()
                start_response("200 OK", [("Content-Type", "application/json")])
                return [body]
            if path == "/_tsc/reset":
                self.reset()
                start_response("200 OK", [])
                return [b""]
            if path == "/_tsc/stall":  # body: {"suffix": [after_bytes, seconds]} or {}
                size = int(environ.get("CONTENT_LENGTH") or 0)
                wanted = json.loads(environ["wsgi.input"].read(size) or b"{}")
                self.stalls.clear()
                self.stalls.update({k: (int(v[0]), float(v[1])) for k, v in wanted.items()})
                start_response("200 OK", [])
                return [b""]
            if path == "/_tsc/stalled":
                with self._lock:
                    body = json.dumps(self.stalled).encode()
                start_response("200 OK", [("Content-Type", "application/json")])
                return [body]
            if path == "/_tsc/faults":  # body: a list of Fault fields, replacing the faults
                size = int(environ.get("CONTENT_LENGTH") or 0)
                wanted = json.loads(environ["wsgi.input"].read(size) or b"[]")
                with self._lock:
                    self.faults[:] = [Fault(**f) for f in wanted]
                start_response("200 OK", [])
                return [b""]
            status: list[int] = [0]

            def recording_start(st: str, headers: list[tuple[str, str]], *a: Any) -> Any:
                status[0] = int(st.split()[0])
                return start_response(st, headers, *a)

            with self._lock:
                self._busy += 1
            with self._arrival:
                what = f"{environ['REQUEST_METHOD']} {path.lstrip('/')}"
                self._arrived[what] = self._arrived.get(what, 0) + 1
                self._arrival.notify_all()
            started = time.monotonic()
            try:
                served = self._serve(app, environ, recording_start, path.lstrip("/"))
            except BaseException:
                with self._lock:
                    self._busy -= 1
                raise
            method = environ["REQUEST_METHOD"]
            key = path.lstrip("/")
            stall = next((v for s, v in self.stalls.items() if key.endswith(s)), None)
            return self._count(served, method, key, status, environ.get("HTTP_RANGE"), stall,
                               started)

        return middleware

    def _take_fault(self, method: str, key: str, signer: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if (fault.count != 0 and fault.method == method and fault.match in key
                        and fault.access_key in ("", signer)):
                    if fault.count > 0:
                        fault.count -= 1
                    return fault
        return None

    def _serve(self, app: Callable[..., Iterable[bytes]], environ: dict[str, Any],
               start_response: Callable[..., Any], key: str) -> Iterable[bytes]:
        """Serve one request through moto, with the fault it is given (if any)."""
        auth = environ.get("HTTP_AUTHORIZATION", "")
        signer = auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth else ""
        fault = self._take_fault(environ["REQUEST_METHOD"], key, signer)
        kind = fault.kind if fault is not None else None
        what = f"{environ['REQUEST_METHOD']} {key}"
        with self._arrival:
            arrived = self._arrived.get(what, 0)  # this request included
        if fault is not None and kind == "stall":
            held = f"{environ['REQUEST_METHOD']} {key}"
            with self._lock:
                self.stalled.append(held)
            time.sleep(fault.seconds)
            with self._lock:
                self.stalled.remove(held)
        if kind in ("conflict", "slowdown", "denied"):
            st, body = (_error(409, "ConditionalRequestConflict", "A conflicting operation "
                               "occurred") if kind == "conflict"
                        else _error(403, "AccessDenied", "Access Denied") if kind == "denied"
                        else _error(503, "SlowDown", "Please reduce your request rate."))
            start_response(st, [("Content-Type", "application/xml")])
            return [body]
        if kind == "ignore_conditions":
            environ.pop("HTTP_IF_NONE_MATCH", None)
            environ.pop("HTTP_IF_MATCH", None)
        conditional = "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ
        if conditional:
            with self._lock:
                key_lock = self._key_locks.setdefault(key, threading.Lock())
            with key_lock:  # moto checks, then writes without a lock
                served: Iterable[bytes] = list(app(environ, start_response if kind != "lost"
                                                   else lambda *a: None))
        else:
            served = app(environ, start_response if kind != "lost" else lambda *a: None)
        if kind == "late":  # applied, but answered after the client has given up waiting
            served = list(served)
            if not self._until_retried(what, arrived, fault.seconds if fault is not None else 0.0):
                _drop(environ)  # the client still waits: it gets no answer at all
            return served
        if kind == "lost":  # applied, but the answer never reaches the client
            served = list(served)
            st, body = _error(500, "InternalError", "We encountered an internal error.")
            start_response(st, [("Content-Type", "application/xml")])
            return [body]
        return served

    def _until_retried(self, what: str, seen: int, seconds: float) -> bool:
        """Hold a late answer until the client sends the same request again (it does so only
        once it has given up waiting for this one: more than ``seen`` such requests have
        arrived), ``seconds`` at most; whether it did."""
        deadline = time.monotonic() + seconds
        with self._arrival:
            while self._arrived.get(what, 0) <= seen and time.monotonic() < deadline:
                self._arrival.wait(max(0.0, deadline - time.monotonic()))
            return self._arrived.get(what, 0) > seen

    def _count(self, body: Iterable[bytes], method: str, key: str, status: list[int],
               rng: str | None, stall: tuple[int, float] | None,
               started: float) -> Iterator[bytes]:
        sent = 0
        try:
            for chunk in body:
                if stall is not None and method == "GET" and sent + len(chunk) > stall[0]:
                    head = stall[0] - sent
                    yield chunk[:head]
                    sent += head
                    time.sleep(stall[1])
                    chunk = chunk[head:]
                    stall = None
                sent += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            with self._lock:
                self.log.append(Request(method, key, status[0], sent, rng, started,
                                        time.monotonic()))
                self._busy -= 1


def _drop(environ: dict[str, Any]) -> None:
    """Close the connection of a request without answering it (the client sees it reset)."""
    sock = environ.get("werkzeug.socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class S3Process:
    """A :class:`CountingS3` in its own process (it then does not share the caller's GIL).

    The same counting, read over HTTP: :meth:`requests`, :meth:`reset`, :meth:`stall`.
    """

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.common.s3server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self._proc.kill()
            raise RuntimeError(f"the S3 server did not start: {line!r}")
        self.host, self.port = "127.0.0.1", int(line)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"}}

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=name)

    def _call(self, path: str, body: bytes | None = None) -> bytes:
        import urllib.request

        req = urllib.request.Request(self.endpoint + path, data=body, method="POST" if body is not None else "GET")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return bytes(resp.read())

    def requests(self, method: str = "GET", under: str = "") -> list[Request]:
        rows = json.loads(self._call("/_tsc/log"))
        return [Request(**r) for r in rows if r["method"] == method and r["key"].startswith(under)]

    def reset(self) -> None:
        self._call("/_tsc/reset", b"")

    def stall(self, stalls: dict[str, tuple[int, float]]) -> None:
        self._call("/_tsc/stall", json.dumps(stalls).encode())

    def inject(self, faults: list[Fault]) -> None:
        """Replace the faults to inject (an empty list: none)."""
        self._call("/_tsc/faults", json.dumps([vars(f) for f in faults]).encode())

    def stalled(self) -> list[str]:
        """The requests a stall fault holds right now (``"PUT bucket/key"``)."""
        return list(json.loads(self._call("/_tsc/stalled")))

    def log(self) -> list[Request]:
        """Every request served since the last reset, of every method."""
        return [Request(**r) for r in json.loads(self._call("/_tsc/log"))]

    def stop(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except Exception:
                self._proc.kill()
                self._proc.wait()


def main() -> None:
    server = CountingS3().start()
    print(server.port, flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin
    finally:
        server.stop()


if __name__ == "__main__":
    main()
