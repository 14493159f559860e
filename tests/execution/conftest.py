"""A real HTTP server on a real socket, in a thread of the test process, with the routes the
execution tests need; and real limiters on the test Redis.

Two host names reach the same server, 127.0.0.1 and localhost, so a redirect between them is a
redirect to another host.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from ratejobs.execution.http import new_session


@dataclass(frozen=True)
class Seen:
    method: str
    path: str  # with the query
    headers: dict[str, str]
    body: bytes
    client_port: int


@dataclass
class TestServer:
    port: int
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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

    def route_cookie(self, rest: list[str], params: dict[str, str], seen: Seen) -> None:
        self._reply(200, b"here is a cookie", {"Set-Cookie": "session=secret-session; Path=/"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: TestServer

    def handle_error(self, request: object, client_address: object) -> None:
        # Clients hanging up early (timeouts, body caps) are what these tests do on purpose.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


@pytest.fixture(scope="session")
def http_server() -> Iterator[TestServer]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = TestServer(port=server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    yield server.state
    server.shutdown()
    server.server_close()


@pytest.fixture
def marker() -> str:
    """A token a test puts in its paths to find its own requests in the server's log."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def session() -> Iterator[requests.Session]:
    made = new_session()
    yield made
    made.close()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
