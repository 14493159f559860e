"""Send one request with requests: bounded in time and size, connected only to addresses the
outbound policy allows, credentials kept on the API's own origin and path, and every network
failure returned as a result rather than raised.

Error kinds say how far the request got, which decides whether a retry could repeat a side
effect:
- "refused": the outbound policy allows no address of the host; nothing was sent, and a retry
  would only be refused again.
- "connect": no connection was made (refused, DNS, TLS, connect timeout); the server never saw
  the request.
- "timeout": connected and sent, but the response did not arrive within the read timeout (per
  read) or the total timeout (the whole exchange).
- "connection": the connection broke after the request was sent (reset, closed early, a body
  that ended short or did not decode).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.cookiejar import DefaultCookiePolicy
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import requests
import urllib3.exceptions
from requests.adapters import DEFAULT_POOLBLOCK, HTTPAdapter
from requests.utils import get_environ_proxies, select_proxy
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import PoolManager, ProxyManager
from urllib3.util.connection import allowed_gai_family

from ratejobs.execution.outbound import (
    AddressRefused,
    OutboundPolicy,
    Resolver,
    connect_allowed,
    refused_address,
)
from ratejobs.execution.request import HttpRequest, merge_headers
from ratejobs.execution.targets import check_climb, redact_url, url_origin

ErrorKind = Literal["refused", "connect", "timeout", "connection"]

# Long enough for a TLS handshake across continents; a host that cannot accept a connection in
# this time is down, and waiting longer only holds the limiter's lease.
DEFAULT_CONNECT_TIMEOUT = 5.0
# Seconds between bytes of the response; slow endpoints (exports, searches) need tens of seconds.
DEFAULT_READ_TIMEOUT = 30.0
# The response body is kept for the call's record; a mebibyte covers any JSON an API answers
# one call with, and a runaway download (or a decompression bomb) stops there.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Response headers kept for the call's record and the limiter. APIs send a dozen or two, a few
# hundred bytes each; past these the rest is padding (or an attack on the database row) and is
# dropped. http.client itself refuses more than 100 header lines of up to 64 KiB each.
MAX_RESPONSE_HEADERS = 64
MAX_RESPONSE_HEADER_BYTES = 64 * 1024
# Redirects followed before the 3xx itself becomes the result; real APIs use one or two (a
# trailing slash, a moved resource), more is a loop.
MAX_REDIRECTS = 5
# Read size while streaming the body: small enough that the cap and the deadline are checked
# often, big enough that a 1 MiB body takes a few dozen reads.
CHUNK_BYTES = 64 * 1024
# Connections kept per host when the caller does not say: a worker process passes the number
# of calls it keeps in flight, so none of its threads opens a connection only to drop it...
POOL_MAXSIZE = 10
# ... and it keeps connections to this many hosts (a worker serves many APIs over its life).
POOL_HOSTS = 10
USER_AGENT = "ratejobs/0.1 (+https://github.com/ratejobs)"
# Error text is cut here: it ends up in the call's record and in logs.
MAX_ERROR_CHARS = 300
# A socket timeout set to the time left can wake a hair before the deadline: within this, the
# total timeout is what expired.
DEADLINE_SLACK_SECONDS = 0.05

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Dropped, besides the API's own credential headers, on a redirect that leaves the API's scope.
_ALWAYS_CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization"})


@dataclass(frozen=True, repr=False)
class HttpResult:
    """What came back. error_kind is None when a whole response arrived; otherwise status_code
    is the status if one arrived before the failure, and body what was read of it."""

    status_code: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    truncated: bool = False  # the body was longer than max_body_bytes and was cut there
    error_kind: ErrorKind | None = None
    error: str = ""
    duration: float = 0.0  # seconds for the whole exchange, redirects included
    url: str = ""  # the URL that gave this result (after redirects)
    redirects: int = 0
    # some headers were dropped: more than MAX_RESPONSE_HEADERS or MAX_RESPONSE_HEADER_BYTES
    headers_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.status_code is not None

    def header(self, name: str) -> str | None:
        """A response header by case-insensitive name."""
        return header_value(self.headers, name)

    def __repr__(self) -> str:
        # Response headers can carry cookies or tokens: names only.
        return (
            f"HttpResult(status_code={self.status_code!r}, error_kind={self.error_kind!r}, "
            f"error={self.error!r}, body=<{len(self.body)} bytes>, truncated={self.truncated}, "
            f"duration={self.duration:.3f}, url={redact_url(self.url)!r}, "
            f"redirects={self.redirects}, headers={sorted(self.headers)!r}, "
            f"headers_truncated={self.headers_truncated})"
        )


class _NoCookies(DefaultCookiePolicy):
    """One session serves every job in the process: a cookie one API call set must never ride
    along on another job's call to the same host."""

    def set_ok(self, cookie: Any, request: Any) -> bool:
        return False

    def return_ok(self, cookie: Any, request: Any) -> bool:
        return False


# --- connect-time address policy and the total deadline, inside urllib3 -------------------


@dataclass(frozen=True)
class _Outbound:
    policy: OutboundPolicy
    resolver: Resolver


class _Watchdog:
    """Shuts down the sockets of one send() once its total timeout passes, whatever the send
    is doing: connecting, the TLS handshake, the status line, headers or body. Socket timeouts
    count per read, so a server that trickles a byte within each would hold the worker (and
    its limiter lease) for as long as it likes.

    It shuts down its own duplicates of the sockets (same connection, other descriptors): a
    descriptor closed and reused meanwhile can never be hit, and the duplicates are closed when
    the send ends."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._stopped = False
        self._seconds = seconds

    def start(self) -> None:
        _deadlines.add(time.monotonic() + self._seconds, self)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def watch(self, sock: socket.socket) -> None:
        try:
            copy = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:  # already closed: nothing left to interrupt
            return
        with self._lock:
            if not self._stopped:
                self._sockets.append(copy)
                if self.fired:
                    _shut(copy)
                return
        copy.close()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()

    def fire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.fired = True
            for sock in self._sockets:
                _shut(sock)


class _Deadlines:
    """One thread per process fires the watchdogs whose deadline has passed. A timer thread
    per send() would cost about 0.2 ms of CPU per call to start and stop, on the hot path.

    A stopped watchdog stays in the heap until its deadline (or a compaction) and is skipped
    then; the heap is rebuilt when stopped entries make up most of it."""

    # Below this many entries a rebuild saves nothing worth its cost.
    COMPACT_ABOVE = 1024

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._heap: list[tuple[float, int, _Watchdog]] = []
        self._added = 0
        self._thread: threading.Thread | None = None

    def add(self, deadline: float, dog: _Watchdog) -> None:
        with self._ready:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="send deadlines",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            if len(self._heap) > self.COMPACT_ABOVE:
                live = [entry for entry in self._heap if not entry[2].stopped]
                if len(live) < len(self._heap) // 2:
                    heapq.heapify(live)
                    self._heap = live
            self._added += 1
            heapq.heappush(self._heap, (deadline, self._added, dog))
            if self._heap[0][2] is dog:  # earlier than what the thread sleeps towards
                self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._ready.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, dog = heapq.heappop(self._heap)
            if not dog.stopped:
                dog.fire()


_deadlines = _Deadlines()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


# The watchdog of the send() running on this thread: urllib3 connects and reads on the
# caller's thread, and its connection objects reach it here without new arguments.
_current = threading.local()


@contextlib.contextmanager
def _watched(seconds: float | None) -> Iterator[_Watchdog | None]:
    if seconds is None:
        yield None
        return
    dog = _Watchdog(seconds)
    _current.dog = dog
    dog.start()
    try:
        yield dog
    finally:
        _current.dog = None
        dog.stop()


class _PolicedConnection:
    """Mixed into urllib3's connection classes: resolves the host itself and connects only to
    addresses the outbound policy allows (every candidate judged, the very address judged is
    the one connected to), and hands each socket to the running send's watchdog.

    TLS is untouched: HTTPSConnection wraps the socket this returns and verifies the
    certificate against the host name (SNI), as before. `outbound` is None for connections to
    a proxy from the environment: that address is the operator's choice, and send() checks
    the target's addresses itself."""

    sock: socket.socket | None

    def __init__(self, *args: Any, outbound: _Outbound | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outbound = outbound
        self._watched_by: _Watchdog | None = None

    def _new_conn(self) -> socket.socket:
        if self.outbound is None:
            sock = super()._new_conn()  # type: ignore[misc]
        else:
            sock = self._connect_allowed(self.outbound)
        self._watch(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None:  # a pooled connection, reused by this send
            self._watch(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]

    def _watch(self, sock: socket.socket) -> None:
        dog = getattr(_current, "dog", None)
        if dog is not None and self._watched_by is not dog:
            dog.watch(sock)
            self._watched_by = dog

    def _connect_allowed(self, allowed: _Outbound) -> socket.socket:
        # As urllib3's HTTPConnection._new_conn, with connect_allowed for create_connection.
        conn: Any = self
        try:
            sock = connect_allowed(
                conn._dns_host,
                conn.port,
                allowed.policy,
                timeout=conn.timeout,
                resolver=allowed.resolver,
                family=allowed_gai_family(),
                source_address=conn.source_address,
                socket_options=conn.socket_options or (),
            )
        except UnicodeError:
            raise urllib3.exceptions.LocationParseError(
                f"'{conn.host}', label empty or too long"
            ) from None
        except socket.gaierror as exc:
            raise urllib3.exceptions.NameResolutionError(conn.host, conn, exc) from exc
        except TimeoutError as exc:
            raise urllib3.exceptions.ConnectTimeoutError(
                conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})"
            ) from exc
        except OSError as exc:
            raise urllib3.exceptions.NewConnectionError(
                conn, f"Failed to establish a new connection: {exc}"
            ) from exc
        sys.audit("http.client.connect", conn, conn.host, conn.port)
        return sock


class _PolicedHTTPConnection(_PolicedConnection, HTTPConnection):
    pass


class _PolicedHTTPSConnection(_PolicedConnection, HTTPSConnection):
    pass


class _PolicedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _PolicedHTTPConnection


class _PolicedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _PolicedHTTPSConnection


_POLICED_POOLS: dict[str, type[HTTPConnectionPool]] = {
    "http": _PolicedHTTPPool,
    "https": _PolicedHTTPSPool,
}


class _PolicedPoolManager(PoolManager):
    def __init__(self, *args: Any, outbound: _Outbound, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool_classes_by_scheme = _POLICED_POOLS
        self.outbound = outbound

    def _new_pool(
        self,
        scheme: str,
        host: str,
        port: int,
        request_context: dict[str, Any] | None = None,
    ) -> HTTPConnectionPool:
        # The policy goes to the pool's connections here, not in connection_pool_kw: every
        # key there is part of urllib3's pool key, which has no field for it.
        pool = super()._new_pool(scheme, host, port, request_context)
        pool.conn_kw["outbound"] = self.outbound
        return pool


class _PolicedAdapter(HTTPAdapter):
    def __init__(self, outbound: _Outbound, **kwargs: Any) -> None:
        self.outbound = outbound  # before super().__init__, which makes the pool manager
        super().__init__(**kwargs)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = DEFAULT_POOLBLOCK, **pool_kwargs: Any
    ) -> None:
        self._pool_connections = connections
        self._pool_maxsize = maxsize
        self._pool_block = block
        self.poolmanager = _PolicedPoolManager(
            num_pools=connections,
            maxsize=maxsize,
            block=block,
            outbound=self.outbound,
            **pool_kwargs,
        )

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is ProxyManager:
            # Connections to the proxy are watched for the total timeout but not policed
            # (outbound stays None): the proxy is the operator's. send() checks the target.
            manager.pool_classes_by_scheme = _POLICED_POOLS
        return manager


def new_session(
    policy: OutboundPolicy,
    *,
    resolver: Resolver = socket.getaddrinfo,
    pool_maxsize: int = POOL_MAXSIZE,
) -> requests.Session:
    """A session that connects only where `policy` allows. `resolver` (socket.getaddrinfo's
    signature) is for tests that need a DNS answer of their own."""
    session = requests.Session()
    # requests never retries on its own (max_retries=0): every send must have its own slot.
    adapter = _PolicedAdapter(
        _Outbound(policy, resolver),
        pool_connections=POOL_HOSTS,
        pool_maxsize=pool_maxsize,
        max_retries=0,
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = USER_AGENT
    session.cookies.set_policy(_NoCookies())
    # No ~/.netrc: the worker's own credentials must not be added to a user's call. Proxies
    # and the CA bundle are still taken from the environment, in send() and here.
    session.trust_env = False
    session.verify = (
        os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    )
    return session


_session_lock = threading.Lock()
_sessions: dict[OutboundPolicy, requests.Session] = {}
_sessions_pid: int | None = None


def session_for_process(
    policy: OutboundPolicy, *, pool_maxsize: int = POOL_MAXSIZE
) -> requests.Session:
    """This process's session for `policy`. A forked child (a Celery prefork worker) must not
    share its parent's pooled sockets, so sessions are kept by process id and made anew after
    a fork."""
    global _sessions, _sessions_pid
    pid = os.getpid()
    with _session_lock:
        if _sessions_pid != pid:
            # The parent's sessions are dropped, not closed: closing would shut sockets the
            # parent still uses.
            _sessions, _sessions_pid = {}, pid
        session = _sessions.get(policy)
        if session is None:
            session = _sessions[policy] = new_session(policy, pool_maxsize=pool_maxsize)
        return session


def _after_fork_in_child() -> None:
    global _session_lock, _deadlines
    # A thread of the parent may have held the lock at the fork, and the deadline thread is
    # not copied by it: the child starts clean.
    _session_lock = threading.Lock()
    _deadlines = _Deadlines()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _TotalTimeout(Exception):
    pass


def send(
    session: requests.Session,
    request: HttpRequest,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    total_timeout: float | None = None,
    max_redirects: int = MAX_REDIRECTS,
) -> HttpResult:
    """Send `request` with a session from new_session() and read at most max_body_bytes of the
    response.

    Redirects are followed by hand, at most `max_redirects` (0: a 3xx is the answer), each
    hop through the outbound
    policy. The credentials stay on while the target is on the request's scope (its base URL:
    same scheme, host and port, under the base path); a redirect anywhere else is followed
    without them (nor Authorization or Cookie) from then on. `total_timeout` bounds the whole
    exchange, connecting and every byte included. Network failures and refused addresses are
    results with an error_kind; a URL requests cannot send to raises ValueError (naming the URL
    with its query values masked).
    """
    started = time.monotonic()
    deadline = None if total_timeout is None else started + total_timeout
    method, url, body = request.method, request.url, request.body
    headers = dict(request.headers)
    scope = request.base_url or _root(request.url)
    redirects = 0
    status: int | None = None
    response_headers: dict[str, str] = {}
    headers_truncated = False
    chunks: list[bytes] = []

    def result(**fields: Any) -> HttpResult:
        return HttpResult(
            status_code=status,
            headers=response_headers,
            headers_truncated=headers_truncated,
            body=b"".join(chunks),
            duration=time.monotonic() - started,
            url=url,
            redirects=redirects,
            **fields,
        )

    def timed_out() -> HttpResult:
        return result(
            truncated=bool(chunks),
            error_kind="timeout",
            error=f"no complete response from {_where(url)} within {total_timeout}s in total",
        )

    hop_connect, hop_read = connect_timeout, read_timeout
    with _watched(total_timeout) as dog:
        try:
            while True:
                # Each hop starts afresh: a failure after a redirect is that hop's, not the 3xx's.
                status, response_headers, headers_truncated = None, {}, False
                if deadline is not None:
                    # Each connect and each read waits at most for the time left; the watchdog
                    # covers a server that answers every read just in time.
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _TotalTimeout
                    hop_connect, hop_read = min(connect_timeout, left), min(read_timeout, left)
                proxies = _environ_proxies(url)
                _check_through_proxy(session, url, proxies)
                response = _urlopen(
                    session, method, url, headers, body, proxies, (hop_connect, hop_read)
                )
                try:
                    status = response.status
                    # repeated headers joined with ", ", as requests showed them
                    response_headers, headers_truncated = _capped_headers(dict(response.headers))
                    target = _redirect_target(status, response.headers.get("Location"), url)
                    if target is not None and redirects < max_redirects:
                        redirects += 1
                        method, body, headers = _redirected(status, method, body, headers)
                        if not _in_scope(target, scope):
                            headers = _without_credentials(headers, request.credential_headers)
                        url = target
                        continue
                    truncated = _read_capped(response, chunks, max_body_bytes, deadline)
                    if dog is not None and dog.fired:  # a body read to its close, cut short
                        return timed_out()
                    return result(truncated=truncated)
                finally:
                    # A body read to its end has given its connection back to the pool
                    # already; one cut short (a redirect, a cap) closes it.
                    response.close()
                    response.release_conn()
        except _TotalTimeout:
            return timed_out()
        except AddressRefused as exc:
            return result(error_kind="refused", error=str(exc)[:MAX_ERROR_CHARS])
        except _SEND_ERRORS as exc:
            chain = _chain(exc)
            fired = dog is not None and dog.fired
            if isinstance(exc, ValueError) and not fired:  # InvalidURL, MissingSchema, ...
                if redirects:  # the server's Location, not the caller's URL
                    return result(
                        error_kind="connection",
                        error=f"redirect to {_where(url)} could not be sent: {type(exc).__name__}",
                    )
                # the message may quote the URL (and a bad header's value): say it without.
                raise ValueError(
                    f"cannot send {request.method} {redact_url(url)}: {type(exc).__name__}"
                ) from None
            kind, message = _describe(exc, url, connect_timeout=hop_connect, read_timeout=hop_read)
            past = deadline is not None and time.monotonic() >= deadline - DEADLINE_SLACK_SECONDS
            if fired or (past and _any(chain, _CONNECT_TIMEOUTS + _READ_TIMEOUTS)):
                if kind != "connect":
                    return timed_out()
                message = f"could not connect to {_where(url)} within {total_timeout}s in total"
            return result(error_kind=kind, error=message)


# The variables that decide an http(s) URL's proxy (urllib.request.getproxies_environment).
_PROXY_VARIABLES = tuple(
    name
    for base in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    for name in (base, base.upper())
) + ("REQUEST_METHOD",)


def _environ_proxies(url: str) -> dict[str, str]:
    """The proxies the environment sets for `url`, worked out once per origin and setting:
    requests scans the whole environment for them, a tenth of a call's CPU per call."""
    parts = urlsplit(url)
    setting = tuple(os.environ.get(name) for name in _PROXY_VARIABLES)
    return dict(_origin_proxies(parts.scheme, parts.netloc, setting))


@functools.lru_cache(maxsize=4096)
def _origin_proxies(scheme: str, netloc: str, setting: tuple) -> dict[str, str]:
    return get_environ_proxies(f"{scheme}://{netloc}/")


def _urlopen(
    session: requests.Session,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes | None,
    proxies: dict[str, str],
    timeout: tuple[float, float],
) -> urllib3.BaseHTTPResponse:
    """Send one request on the session's policed connection pools (through the environment's
    proxy, if any), as requests' adapter does, without Session.request: preparing each request
    there (merging settings, re-parsing and re-quoting a URL already built and checked) cost a
    third of a worker's CPU per call in bench-jobs."""
    adapter = session.get_adapter(url)
    target = requests.PreparedRequest()
    target.url = url
    pool = adapter.get_connection_with_tls_context(target, session.verify, proxies=proxies)
    adapter.cert_verify(pool, url, session.verify, None)
    return pool.urlopen(
        method=method,
        url=adapter.request_url(target, proxies),
        body=body,
        headers=merge_headers(session.headers, headers),
        redirect=False,
        assert_same_host=False,
        preload_content=False,
        decode_content=False,
        retries=False,
        timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
        chunked=False,
    )


def _check_through_proxy(session: requests.Session, url: str, proxies: dict[str, str]) -> None:
    """The outbound policy for a request that goes through a proxy from the environment.

    Limitation: the connection is to the proxy (the operator's choice, and allowed), and the
    proxy resolves the target itself. The target's addresses are checked here, from the
    worker's own DNS, before sending; a name that resolves differently at the proxy (DNS
    rebinding) or not at all here is not caught. Restrict internal destinations at the proxy
    too."""
    adapter = session.get_adapter(url)
    if not isinstance(adapter, _PolicedAdapter):
        raise TypeError("send() needs a session made by new_session() or session_for_process()")
    if proxies and select_proxy(url, proxies):
        refused = refused_address(url, adapter.outbound.policy, adapter.outbound.resolver)
        if refused is not None:
            raise refused


def _read_capped(
    response: urllib3.BaseHTTPResponse, chunks: list[bytes], limit: int, deadline: float | None
) -> bool:
    """Append up to `limit` bytes of the (decoded) body to `chunks`; whether there was more.

    read1 returns whatever one read of the socket gave, so the deadline is checked as bytes
    trickle in (iter_content would block until a whole chunk arrived), and what arrived before
    a failure is kept. It also decompresses no more than it is asked for."""
    size = 0
    while chunk := response.read1(CHUNK_BYTES, decode_content=True):
        if size + len(chunk) > limit:
            chunks.append(chunk[: limit - size])
            return True
        chunks.append(chunk)
        size += len(chunk)
        if deadline is not None and time.monotonic() > deadline:
            raise _TotalTimeout
    return False


def _redirect_target(status: int, location: str | None, url: str) -> str | None:
    """The http(s) URL a redirect points at; None for anything else (not a redirect, no
    Location, another scheme, a URL with credentials or spaces in it), which is then the
    result as it is."""
    if status not in _REDIRECTS or not location:
        return None
    try:
        target = urljoin(url, location.strip())
        parts = urlsplit(target)
        parts.port  # noqa: B018 - raises on a port out of range or not a number
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    if parts.username is not None or parts.password is not None:
        return None  # requests would turn them into an Authorization header
    if any(ord(char) <= 0x20 or ord(char) == 0x7F for char in target):
        return None
    return target


def _in_scope(target: str, scope: str) -> bool:
    """Whether `target` is where the credentials of `scope` (an API's base URL) may go: same
    scheme, host and port, and a path under the base path by every reading (segment by
    segment, and no escaped "..", "%2F" or backslash climbing out of it)."""
    if url_origin(target) != url_origin(scope):
        return False
    base = urlsplit(scope).path.rstrip("/")
    path = urlsplit(target).path
    if base and not (path == base or path.startswith(base + "/")):
        return False
    try:
        check_climb(path[len(base) :])
    except ValueError:
        return False
    return True


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """A header by case-insensitive name from a plain mapping (a response's headers as kept)."""
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def _without_credentials(headers: dict[str, str], names: frozenset[str]) -> dict[str, str]:
    dropped = _ALWAYS_CREDENTIALS | names
    return {k: v for k, v in headers.items() if k.lower() not in dropped}


def _capped_headers(headers: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """At most MAX_RESPONSE_HEADERS headers of MAX_RESPONSE_HEADER_BYTES in all, in the order
    they came; whether any were dropped. One huge header is skipped, not the ones after it."""
    kept: dict[str, str] = {}
    size = 0
    dropped = False
    for name, value in headers.items():
        cost = len(name) + len(value)
        if len(kept) >= MAX_RESPONSE_HEADERS or size + cost > MAX_RESPONSE_HEADER_BYTES:
            dropped = True
            continue
        kept[name] = value
        size += cost
    return kept, dropped


def _redirected(
    status: int, method: str, body: bytes | None, headers: dict[str, str]
) -> tuple[str, bytes | None, dict[str, str]]:
    # As browsers and requests do: 303 turns everything but HEAD into a GET, 301/302 turn a
    # POST into a GET; 307/308 repeat the request as it was.
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        without_body = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        return "GET", None, without_body
    return method, body, headers


def _where(url: str) -> str:
    scheme, host, port = url_origin(url)
    return f"{scheme}://{host}:{port}"


def _root(url: str) -> str:
    """The origin of `url` as a base URL: the scope of a request built without one."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _describe(
    exc: BaseException, url: str, *, connect_timeout: float, read_timeout: float
) -> tuple[ErrorKind, str]:
    chain = _chain(exc)
    where = _where(url)
    reason = _reason(chain, url)
    # NewConnectionError is a ConnectTimeoutError to urllib3 (for old callers): test it first.
    if _any(chain, _CONNECT_FAILURES):
        return "connect", f"could not connect to {where}: {reason}"
    if _any(chain, _CONNECT_TIMEOUTS):
        return "connect", f"could not connect to {where} within {connect_timeout}s"
    if _any(chain, _READ_TIMEOUTS):
        return "timeout", f"no response from {where} within {read_timeout}s"
    return "connection", f"connection to {where} failed: {reason}"


# What sending can raise: urllib3's errors, the socket's, requests' (a proxy URL it cannot
# use), and ValueError for what http.client refuses to write (its message may quote a value).
_SEND_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, OSError, ValueError)
_CONNECT_FAILURES = (
    urllib3.exceptions.NewConnectionError,  # refused, unreachable, DNS (NameResolutionError)
    urllib3.exceptions.SSLError,
    urllib3.exceptions.ProxyError,
    requests.exceptions.SSLError,
    requests.exceptions.ProxyError,
)
_CONNECT_TIMEOUTS = (requests.ConnectTimeout, urllib3.exceptions.ConnectTimeoutError)
_READ_TIMEOUTS = (requests.ReadTimeout, urllib3.exceptions.ReadTimeoutError, TimeoutError)


def _any(chain: list[BaseException], types: tuple[type[BaseException], ...]) -> bool:
    return any(isinstance(e, types) for e in chain)


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and every exception it wraps (requests and urllib3 nest them in args and .reason)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        nested = [*current.args, getattr(current, "reason", None)]
        nested += [current.__cause__, current.__context__]
        todo.extend(e for e in nested if isinstance(e, BaseException))
    return seen


def _reason(chain: list[BaseException], url: str) -> str:
    # The innermost error says what happened ("Connection refused"); the wrappers around it
    # repeat the URL, query and all, which may hold a key.
    root = chain[-1]
    for candidate in reversed(chain):
        if not type(candidate).__module__.startswith(("requests", "urllib3")):
            root = candidate
            break
    if isinstance(root, OSError) and root.strerror:
        text = root.strerror
    else:
        text = f"{type(root).__name__}: {root}" if str(root) else type(root).__name__
    text = text.replace(url, redact_url(url))
    query = urlsplit(url).query
    if query:
        text = text.replace(query, "***")
    return text[:MAX_ERROR_CHARS]
