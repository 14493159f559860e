"""The sandbox HTTP server: standard library only, one thread per connection, keep-alive."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import socket
import socketserver
import sys
import threading
import time
from datetime import UTC, datetime
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

from sandbox.bucket import MAIN, TOKENS
from sandbox.config import SandboxConfig
from sandbox.process import SandboxProcess, start_sandbox_process
from sandbox.state import THROTTLED, Admission, Answer, SandboxState

__all__ = ["Sandbox", "SandboxConfig", "SandboxProcess", "start_sandbox_process"]

# Clients connect in bursts (a benchmark opening a session per thread); the default backlog of 5
# would turn the sixth into a SYN retry a second later.
LISTEN_BACKLOG = 1024
# /big builds its body in memory; a typo of a few zeros should not take the machine with it.
MAX_BIG_BYTES = 64 * 1024 * 1024
MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024
# How often serve_forever looks for a stop request; only stop() waits on it.
POLL_INTERVAL_S = 0.05
# Handler threads end within milliseconds of their sockets being shut down; this only bounds a
# stop() that something unforeseen holds up.
STOP_TIMEOUT_S = 5.0
JSON = "application/json"
# What an admitted request was charged from the token budget, as the response reports it.
TOKENS_USED_HEADER = "X-Tokens-Used"
# A request that names no tokens costs one: a budget is then a second request quota, and no
# request is free.
DEFAULT_TOKENS = 1
CONNECTION_THREAD_PREFIX = "sandbox connection "

_REASONS = {status.value: status.phrase for status in HTTPStatus}
# Statuses whose responses carry no body (RFC 9110 6.4.1); 204 has no Content-Length either.
_NO_BODY = frozenset({204, 304})


class _Server(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], state: SandboxState) -> None:
        self.state = state
        self.stopping = threading.Event()  # cuts /slow and --latency sleeps short on stop()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, a DNS round trip we have no use for.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request: Any, client_address: Any) -> None:
        # ThreadingMixIn's, keeping track of its daemon threads (it only tracks the others) so
        # that stop() can end and join them.
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name=f"{CONNECTION_THREAD_PREFIX}{client_address}",
            daemon=True,
        )
        with self._connections_lock:
            self._connections[request] = thread
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.pop(request, None)

    def end_connections(self, timeout: float) -> None:
        """Wake every handler thread (idle on keep-alive, sleeping in /slow or writing) and
        join them."""
        self.stopping.set()
        with self._connections_lock:
            connections = list(self._connections.items())
        for connection, _ in connections:
            with contextlib.suppress(OSError):  # already gone
                connection.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for _, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-response is ordinary for a load-testing target.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ratejobs-sandbox"
    sys_version = ""
    # Responses go out in one write, but a client pipelining requests should not wait on Nagle.
    disable_nagle_algorithm = True
    server: _Server

    def handle_one_request(self) -> None:
        # BaseHTTPRequestHandler's, minus the do_<METHOD> lookup: every method is served.
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            return
        if not self.raw_requestline:
            self.close_connection = True
            return
        if not self.parse_request():
            return
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # thousands of requests a second; /__stats?detail=1 is the access log

    def _serve(self) -> None:
        body = self._read_body()
        if body is None:
            return
        path, _, query_string = self.path.partition("?")
        query = dict(parse_qsl(query_string, keep_blank_values=True))
        if path.startswith("/__"):
            self._control(path, query, body)
            return
        state = self.server.state
        header = state.config.idempotency_header
        key = (self.headers.get(header) or None) if header else None
        if key is not None:
            earlier = state.begin_key(key)
            if earlier is not None:  # given again, or refused while the first is answered
                self._send(earlier.status, earlier.body, list(earlier.headers))
                return
        status, problem = _route(path, query)
        config = state.config
        tokens, named, token_problem = _requested_tokens(query, body, config)
        if token_problem is not None and problem is None:
            status, problem = 400, token_problem
        answer = None
        try:
            admission = state.admit(
                path,
                status,
                self.headers.get("X-Request-Id"),
                key,
                tokens=tokens,
                limit_key=limit_key(self.headers, config.limit_by_header),
            )
            # Usage is reported where someone counts tokens: a budget, or a request naming them.
            report = named or config.token_rate is not None
            answer = self._decide(admission, problem, path, query, len(body), report_usage=report)
        finally:
            # Remembered before it is sent: a client that has the answer and tries again
            # gets it again, never a 409; a client that died meanwhile gets it on its retry.
            if key is not None:
                state.end_key(key, answer)
        self._send(answer.status, answer.body, list(answer.headers))
        if admission.arrival.throttled:
            state.mark_sent(admission.arrival, time.monotonic_ns())

    def _decide(
        self,
        admission: Admission,
        problem: str | None,
        path: str,
        query: dict[str, str],
        body_bytes: int,
        *,
        report_usage: bool = False,
    ) -> Answer:
        """The answer to an arrival the server admitted or throttled (see _route)."""
        arrival = admission.arrival
        headers = _quota_headers(admission)
        if report_usage:
            headers.append((TOKENS_USED_HEADER, str(arrival.tokens)))
        if admission.config.latency:
            self.server.stopping.wait(admission.config.latency)
        if arrival.throttled:
            if arrival.retry_after is not None:
                headers.append(("Retry-After", _retry_after_value(admission)))
            return Answer(THROTTLED, {"error": "rate limited"}, tuple(headers))
        if admission.injected_error:
            return Answer(arrival.status, {"error": "injected error"}, tuple(headers))
        if problem is not None:
            return Answer(arrival.status, {"error": problem}, tuple(headers))
        answer = self._answer(path, query, body_bytes, arrival.n, headers)
        if report_usage and isinstance(answer, dict):
            answer["usage"] = {"total_tokens": arrival.tokens}  # OpenAI's name for it
        return Answer(arrival.status, answer, tuple(headers))

    def _answer(
        self,
        path: str,
        query: dict[str, str],
        body_bytes: int,
        n: int,
        headers: list[tuple[str, str]],
    ) -> dict[str, Any] | bytes:
        """The body of an admitted request with well-formed parameters (see _route)."""
        if path.startswith("/status/"):
            return {"status": int(path.removeprefix("/status/")), "n": n}
        if path == "/redirect":
            headers.append(("Location", query["to"]))
            return {"location": query["to"], "n": n}
        if path == "/big":
            return b"x" * int(query["bytes"])
        if path == "/slow":
            self.server.stopping.wait(float(query["seconds"]))
        return {
            "method": self.command,
            "path": path,
            "query": query,
            "n": n,
            "body_bytes": body_bytes,
        }

    def _control(self, path: str, query: dict[str, str], body: bytes) -> None:
        state = self.server.state
        if path == "/__stats":
            window = None
            if "window" in query:
                window = _float(query["window"])
                if window is None or window <= 0:
                    self._send(400, {"error": "window must be a positive number of seconds"})
                    return
            detail = query.get("detail", "0") not in ("", "0", "false")
            self._send(200, state.stats(window=window, detail=detail))
        elif path == "/__reset":
            if self.command != "POST":
                self._send(405, {"error": "POST to reset"}, [("Allow", "POST")])
                return
            state.reset()
            self._send(200, {"reset": True})
        elif path == "/__config":
            if self.command == "GET":
                self._send(200, state.config.live_fields())
                return
            if self.command != "POST":
                self._send(405, {"error": "GET or POST"}, [("Allow", "GET, POST")])
                return
            try:
                changes = json.loads(body or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("expected a JSON object")
                config = state.config.with_changes(changes)
            except (ValueError, TypeError) as exc:
                self._send(400, {"error": str(exc)})
                return
            state.configure(config)
            self._send(200, config.live_fields())
        else:
            self._send(404, {"error": f"no control endpoint {path}"})

    def _read_body(self) -> bytes | None:
        """The request body, whole; None after answering a request whose body can't be read."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = _int(self.headers.get("Content-Length", "0"))
        if length is None or length < 0:
            self.close_connection = True
            self._send(400, {"error": "bad Content-Length"})
            return None
        if length > MAX_REQUEST_BODY_BYTES:
            self.close_connection = True
            self._send(413, {"error": "request body too large"})
            return None
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes | None:
        chunks, total = [], 0
        while True:
            size = _int(self.rfile.readline(1024).split(b";", 1)[0].strip(), base=16)
            if size is None or size < 0 or total + size > MAX_REQUEST_BODY_BYTES:
                self.close_connection = True
                self._send(400, {"error": "bad chunked body"})
                return None
            if size == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailer fields
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            total += size
            self.rfile.readline(1024)  # CRLF after the chunk

    def _send(
        self,
        status: int,
        body: dict[str, Any] | bytes,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """The whole response in one write: status line, headers and body."""
        if isinstance(body, bytes):
            payload, content_type = body, "application/octet-stream"
        else:
            payload, content_type = json.dumps(body).encode(), JSON
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}"]
        if self.server.state.config.date:
            lines.append(f"Date: {_http_date_now()}")
        lines.append(f"Server: {self.server_version}")
        if status in _NO_BODY:
            payload = b""
            if status == 304:
                lines.append("Content-Length: 0")
        else:
            lines.append(f"Content-Type: {content_type}")
            lines.append(f"Content-Length: {len(payload)}")
        lines.extend(f"{name}: {value}" for name, value in headers or ())
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(head if self.command == "HEAD" else head + payload)


def limit_key(headers: Any, header: str) -> str | None:
    """--limit-by-header: whose buckets decide a request, as a digest of the header's value
    (a credential: the stats and the log name it without showing it); a request without the
    header shares the bucket of the empty value. None: one set of buckets for all."""
    if not header:
        return None
    value = headers.get(header) or ""
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _route(path: str, query: dict[str, str]) -> tuple[int, str | None]:
    """The status the API would answer were it not for the limit and injected errors, and what
    is wrong with the request when that is a 400."""
    if path.startswith("/status/"):
        code = _int(path.removeprefix("/status/"))
        if code is None or not 200 <= code <= 599:
            return 400, "status must be a code from 200 to 599"
        return code, None
    if path == "/redirect":
        return (302, None) if query.get("to") else (400, "redirect needs ?to=<url>")
    if path == "/slow":
        seconds = _float(query.get("seconds", ""))
        if seconds is None or seconds < 0:
            return 400, "slow needs ?seconds=<non-negative number>"
    if path == "/big":
        size = _int(query.get("bytes", ""))
        if size is None or not 0 <= size <= MAX_BIG_BYTES:
            return 400, f"big needs ?bytes=<0..{MAX_BIG_BYTES}>"
    return 200, None


def _quota_headers(admission: Admission) -> list[tuple[str, str]]:
    """The quota headers of `admission.config.headers`. A style with room for one request quota
    advertises the tightest of the main one and the windows; IETF lists them all."""
    config = admission.config
    decision = admission.decision
    tightest = decision.tightest if decision is not None else None
    limit = config.rate if tightest is None else tightest.limit
    burst = config.burst if tightest is None else tightest.burst
    token_quota = decision.tokens if decision is not None else None
    if config.headers == "github":
        reset = math.ceil(time.time() + admission.reset_after)  # epoch seconds, never early
        return [
            ("X-RateLimit-Limit", _number(limit)),
            ("X-RateLimit-Remaining", str(admission.remaining)),
            ("X-RateLimit-Reset", str(reset)),
        ]
    if config.headers == "ietf":
        # draft-ietf-httpapi-ratelimit-headers (08 and later): integers where the draft asks
        # for them; a fractional rate or period goes out as a decimal with 3 digits at most.
        # The main quota keeps the name "default"; the token budget says its unit (qu).
        quotas = list(decision.requests) if decision is not None else []
        if token_quota is not None:
            quotas.append(token_quota)
        if not quotas:
            return []
        policies, states = [], []
        for quota in quotas:
            name = "default" if quota.name == MAIN else quota.name
            unit = ';qu="tokens"' if quota.name == TOKENS else ""
            policies.append(f'"{name}";q={_number(quota.limit)};w={_number(quota.period)}{unit}')
            states.append(f'"{name}";r={quota.remaining};t={math.ceil(quota.reset_after)}')
        return [("RateLimit-Policy", ", ".join(policies)), ("RateLimit", ", ".join(states))]
    if config.headers == "openai":
        headers = [
            ("x-ratelimit-limit-requests", _number(limit)),
            ("x-ratelimit-remaining-requests", str(admission.remaining)),
            ("x-ratelimit-reset-requests", _go_duration(admission.reset_after)),
        ]
        if token_quota is not None:  # only a sandbox with a token budget has tokens to count
            headers += [
                ("x-ratelimit-limit-tokens", _number(token_quota.limit)),
                ("x-ratelimit-remaining-tokens", str(token_quota.remaining)),
                ("x-ratelimit-reset-tokens", _go_duration(token_quota.reset_after)),
            ]
        return headers
    if config.headers == "anthropic":
        headers = [
            ("anthropic-ratelimit-requests-limit", _number(limit)),
            ("anthropic-ratelimit-requests-remaining", str(admission.remaining)),
            ("anthropic-ratelimit-requests-reset", _rfc3339_after(admission.reset_after)),
        ]
        if token_quota is not None:
            headers += [
                ("anthropic-ratelimit-tokens-limit", _number(token_quota.limit)),
                ("anthropic-ratelimit-tokens-remaining", str(token_quota.remaining)),
                ("anthropic-ratelimit-tokens-reset", _rfc3339_after(token_quota.reset_after)),
            ]
        return headers
    if config.headers == "shopify":
        # Marbles in the bucket / its size: the burst is the bucket, the rate its leak.
        used = burst - admission.remaining
        return [("X-Shopify-Shop-Api-Call-Limit", f"{used}/{burst}")]
    return []


def _rfc3339_after(seconds: float) -> str:
    """A whole second, never early, as Anthropic sends its resets."""
    reset = datetime.fromtimestamp(math.ceil(time.time() + seconds), UTC)
    return reset.strftime("%Y-%m-%dT%H:%M:%SZ")


def _requested_tokens(
    query: dict[str, str], body: bytes, config: SandboxConfig
) -> tuple[int, bool, str | None]:
    """The tokens a request asks for, whether it named them, and what is wrong with them.

    ?tokens=N wins over a JSON body's "tokens": the query is read on every method and before
    the body. Not named: DEFAULT_TOKENS. Malformed, or more than the budget's burst (it could
    never be admitted): a 400 that costs no tokens."""
    value: object = None
    if "tokens" in query:
        value = _int(query["tokens"])
        if value is None:
            return 0, True, "tokens must be a whole number >= 0"
    elif body[:1] == b"{":  # cheap test first: most bodies are no JSON object
        with contextlib.suppress(ValueError):
            value = json.loads(body).get("tokens")
    if value is None:
        return DEFAULT_TOKENS, False, None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0, True, "tokens must be a whole number >= 0"
    burst = config.effective_token_burst
    if config.token_rate is not None and value > burst:
        return 0, True, f"tokens={value} is more than the token budget's burst of {burst}"
    return value, True, None


def _go_duration(seconds: float) -> str:
    """Seconds as Go prints a time.Duration ("20ms", "1.25s", "6m0s"), in whole milliseconds
    rounded up, as OpenAI sends its resets: never earlier than the quota is whole again."""
    millis = math.ceil(seconds * 1000)
    if millis < 1000:
        return f"{millis}ms" if millis else "0s"
    minutes, millis = divmod(millis, 60_000)
    hours, minutes = divmod(minutes, 60)
    text = f"{millis / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def _retry_after_value(admission: Admission) -> str:
    arrival = admission.arrival
    if arrival.retry_date is not None:
        return formatdate(arrival.retry_date, usegmt=True)
    return str(int(arrival.retry_after or 0))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}".rstrip("0")


_date_cache: tuple[int, str] = (0, "")


def _http_date_now() -> str:
    # formatdate costs more than the rest of a response; a Date has whole seconds anyway.
    global _date_cache
    second = int(time.time())
    cached_second, text = _date_cache
    if cached_second != second:
        text = formatdate(second, usegmt=True)
        _date_cache = (second, text)
    return text


def _int(text: str | bytes, base: int = 10) -> int | None:
    try:
        return int(text, base)
    except (TypeError, ValueError):
        return None


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class Sandbox:
    """A sandbox served from a background thread of this process (or the calling thread, with
    `run()`).

        with Sandbox(SandboxConfig(rate=20, burst=5)) as sandbox:
            requests.get(sandbox.url + "/anything")
    """

    def __init__(self, config: SandboxConfig | None = None, **options: Any) -> None:
        if config is None:
            config = SandboxConfig(**options)
        elif options:
            config = dataclasses.replace(config, **options)
        self.state = SandboxState(config)
        self._address = (config.host, config.port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._serving = False  # serve_forever was called (shutdown() waits for it otherwise)
        self._lock = threading.Lock()

    @property
    def config(self) -> SandboxConfig:
        return self.state.config

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the sandbox is not listening; start() it first")
        host, port = self._server.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def bind(self) -> _Server:
        """Listen (on a free port when the config says 0), without serving yet."""
        with self._lock:
            if self._server is None:
                self._server = _Server(self._address, self.state)
            return self._server

    def start(self) -> Sandbox:
        self._server = self.bind()
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(POLL_INTERVAL_S,),
            name=f"sandbox {self.url}",
            daemon=True,
        )
        self._serving = True
        self._thread.start()
        return self

    def run(self) -> None:
        """Serve from the calling thread until stop() is called from another one."""
        self._server = self.bind()
        self._serving = True
        try:
            self._server.serve_forever(POLL_INTERVAL_S)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop listening, end every connection and join every handler thread."""
        with self._lock:
            server, self._server = self._server, None
            thread, self._thread = self._thread, None
            serving, self._serving = self._serving, False
        if server is None:
            return
        if serving:
            server.shutdown()
        server.server_close()  # no new connections
        server.end_connections(STOP_TIMEOUT_S)
        if thread is not None:
            thread.join()

    def stats(self, *, window: float | None = None, detail: bool = False) -> dict[str, Any]:
        return self.state.stats(window=window, detail=detail)

    def reset(self) -> None:
        self.state.reset()

    def configure(self, **changes: Any) -> SandboxConfig:
        config = self.state.config.with_changes(changes)
        self.state.configure(config)
        return config

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
