"""A real HTTP server on a real socket, in a thread of the test process, with the routes the
execution tests need; and real limiters on the test Redis.

Two host names reach the same server, 127.0.0.1 and localhost, so a redirect between them is a
redirect to another host.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from ratejobs.execution.connections import new_session
from ratejobs.execution.outbound import OutboundPolicy

# The test servers listen on 127.0.0.1 (and localhost resolves there): the only addresses the
# tests' sessions may reach. 127.0.0.2 stays outside, for the tests of refusals.
LOOPBACK = OutboundPolicy.from_allow_list(["127.0.0.1/32", "::1/128"])


@dataclass(frozen=True)
class Seen:
    method: str
    path: str  # with the query
    headers: dict[str, str]
    body: bytes
    client_port: int


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class TestServer:
    port: int
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: dict[str, Answer] = field(default_factory=dict)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, marker: str, status: int, headers: dict[str, str], body: bytes = b"") -> str:
        """Have /answer/<marker> reply with this (until told otherwise); returns that path.
        For headers no query string could carry, or a path could not hold."""
        with self.lock:
            self.answers[marker] = Answer(status, headers, body)
        return f"/answer/{marker}"

    def requests_with(self, marker: str) -> list[Seen]:
        """The requests whose path contains `marker` (tests share the server, not markers)."""
        with self.lock:
            return [s for s in self.seen if marker in s.path]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        seen = Seen(
            self.command, self.path, dict(self.headers.items()), body, self.client_address[1]
        )
        with self.server.state.lock:
            self.server.state.seen.append(seen)
        parts = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        route = parts.path.strip("/").split("/")
        handler = getattr(self, "route_" + route[0].replace("-", "_"), None)
        if handler is None:
            self._reply(404, b"no such route")
        else:
            handler(route[1:], params, seen)

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def route_ok(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        self._reply(200, b"ok", {"Content-Type": "text/plain"})

    def route_status(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        time.sleep(float(params.get("delay", "0")))
        headers = {}
        if "retry_after" in params:
            headers["Retry-After"] = params["retry_after"]
        if "remaining" in params:
            headers["X-RateLimit-Remaining"] = params["remaining"]
            headers["X-RateLimit-Reset"] = params.get("reset", "30")
        self._reply(int(rest[0]), f"status {rest[0]}".encode(), headers)

    def route_answer(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        with self.server.state.lock:
            answer = self.server.state.answers.get(rest[0])
        if answer is None:
            self._reply(404, b"no answer for this marker")
        else:
            self._reply(answer.status, answer.body, answer.headers)

    def route_redirect(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        self._reply(int(params.get("code", "302")), b"", {"Location": params["to"]})

    def route_chain(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        # /chain/<n>/<marker>: n more same-host redirects, then 200
        hops, marker = int(rest[0]), rest[1]
        if hops == 0:
            self._reply(200, b"end of chain")
        else:
            self._reply(302, b"", {"Location": f"/chain/{hops - 1}/{marker}"})

    def route_slow(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        time.sleep(float(params.get("seconds", "2")))
        self._reply(200, b"late")

    def route_trickle(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        # one byte every `interval` seconds: each read is quick, the whole body is not
        count, interval = int(params.get("bytes", "20")), float(params.get("interval", "0.1"))
        self.send_response(200)
        self.send_header("Content-Length", str(count))
        self.end_headers()
        try:
            for _ in range(count):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(interval)
        except OSError:
            self.close_connection = True

    def route_big(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        try:
            self._reply(200, b"b" * int(params["size"]))
        except OSError:  # the client stopped reading at its cap and closed
            self.close_connection = True

    def route_short(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        # promises 100 bytes, sends 10, hangs up
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b"0123456789")
        self.wfile.flush()
        self.close_connection = True

    def route_drop(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        self.close_connection = True  # hang up without a response

    def route_echo(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        payload = {
            "method": seen.method,
            "path": seen.path,
            "headers": seen.headers,
            "body": seen.body.decode("latin-1"),
        }
        self._reply(200, json.dumps(payload).encode(), {"Content-Type": "application/json"})

    def route_trickle_head(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        # the status line and headers themselves, one byte every `interval` seconds: no read
        # ever waits long, and the response never gets past its headers
        interval = float(params.get("interval", "0.3"))
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Padding: " + b"p" * 200 + b"\r\n\r\nok"
        self.close_connection = True
        try:
            for byte in head:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(interval)
        except OSError:
            pass

    def route_bomb(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        # /bomb/<gzip|deflate>?mib=N: N MiB of zeros, compressed as they are sent (about a
        # thousandth of that on the wire), until the client hangs up; nothing is held whole
        encoding, mib = rest[0], int(params.get("mib", "1024"))
        wbits = {"gzip": 31, "deflate": 15}[encoding]
        compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
        zeros = bytes(1024 * 1024)
        self.send_response(200)
        self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Connection", "close")  # no length: the body ends when we close
        self.end_headers()
        self.close_connection = True
        try:
            for _ in range(mib):
                self.wfile.write(compressor.compress(zeros))
            self.wfile.write(compressor.flush())
        except OSError:
            pass

    def route_headers(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        # /headers?count=N&size=S: N headers X-Pad-<i> of S bytes each, then X-Last
        count, size = int(params.get("count", "10")), int(params.get("size", "10"))
        headers = {f"X-Pad-{i}": "v" * size for i in range(count)}
        self._reply(200, b"ok", {**headers, "X-Last": "last"})

    def route_cookie(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        self._reply(200, b"here is a cookie", {"Set-Cookie": "session=secret-session; Path=/"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: TestServer

    def handle_error(self, request: object, client_address: object) -> None:
        # Clients hanging up early (timeouts, body caps) are what these tests do on purpose.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serving(host: str = "127.0.0.1") -> Iterator[TestServer]:
    """The test routes on a fresh port of `host`, in a thread, for the block."""
    server = _Server((host, 0), _Handler)
    server.state = TestServer(port=server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    try:
        yield server.state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def http_server() -> Iterator[TestServer]:
    with serving() as state:
        yield state


@pytest.fixture(scope="session")
def second_server() -> Iterator[TestServer]:
    """Another origin (another port) on 127.0.0.1."""
    with serving() as state:
        yield state


@pytest.fixture
def marker() -> str:
    """A token a test puts in its paths to find its own requests in the server's log."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def session() -> Iterator[requests.Session]:
    made = new_session(LOOPBACK)
    yield made
    made.close()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
