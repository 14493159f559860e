"""Send one request with requests: bounded in time and size, redirects kept on the API's own
origin, and every network failure returned as a result rather than raised.

Error kinds say how far the request got, which decides whether a retry could repeat a side
effect:
- "connect": no connection was made (refused, DNS, TLS, connect timeout); the server never saw
  the request.
- "timeout": connected and sent, but the response did not arrive within the read timeout (per
  read) or the total timeout (the whole exchange).
- "connection": the connection broke after the request was sent (reset, closed early, a body
  that ended short or did not decode).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from http.cookiejar import DefaultCookiePolicy
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from requests.utils import get_environ_proxies

from ratejobs.execution.request import HttpRequest
from ratejobs.execution.urls import redact_url

ErrorKind = Literal["connect", "timeout", "connection"]

# Long enough for a TLS handshake across continents; a host that cannot accept a connection in
# this time is down, and waiting longer only holds the limiter's lease.
DEFAULT_CONNECT_TIMEOUT = 5.0
# Seconds between bytes of the response; slow endpoints (exports, searches) need tens of seconds.
DEFAULT_READ_TIMEOUT = 30.0
# The response body is kept for the call's record; a mebibyte covers any JSON an API answers
# one call with, and a runaway download (or a decompression bomb) stops there.
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Same-origin redirects followed before the 3xx itself becomes the result; real APIs use one or
# two (a trailing slash, a moved resource), more is a loop.
MAX_REDIRECTS = 5
# Read size while streaming the body: small enough that the cap and the deadline are checked
# often, big enough that a 1 MiB body takes a few dozen reads.
CHUNK_BYTES = 64 * 1024
# A worker process sends one call at a time, so one connection per host is all it reuses...
POOL_MAXSIZE = 1
# ... and keeps connections to this many hosts (a worker serves many APIs over its life).
POOL_HOSTS = 10
USER_AGENT = "ratejobs/0.1 (+https://github.com/ratejobs)"
# Error text is cut here: it ends up in the call's record and in logs.
MAX_ERROR_CHARS = 300

_REDIRECTS = frozenset({301, 302, 303, 307, 308})


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

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.status_code is not None

    def header(self, name: str) -> str | None:
        """A response header by case-insensitive name."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), None)

    def __repr__(self) -> str:
        # Response headers can carry cookies or tokens: names only.
        return (
            f"HttpResult(status_code={self.status_code!r}, error_kind={self.error_kind!r}, "
            f"error={self.error!r}, body=<{len(self.body)} bytes>, truncated={self.truncated}, "
            f"duration={self.duration:.3f}, url={redact_url(self.url)!r}, "
            f"redirects={self.redirects}, headers={sorted(self.headers)!r})"
        )


class _NoCookies(DefaultCookiePolicy):
    """One session serves every job in the process: a cookie one API call set must never ride
    along on another job's call to the same host."""

    def set_ok(self, cookie: Any, request: Any) -> bool:
        return False

    def return_ok(self, cookie: Any, request: Any) -> bool:
        return False


def new_session() -> requests.Session:
    session = requests.Session()
    # requests never retries on its own (max_retries=0): every send must have its own slot.
    adapter = HTTPAdapter(pool_connections=POOL_HOSTS, pool_maxsize=POOL_MAXSIZE, max_retries=0)
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
_session: tuple[int, requests.Session] | None = None


def session_for_process() -> requests.Session:
    """This process's session. A forked child (a Celery prefork worker) must not share its
    parent's pooled sockets, so the session is keyed by process id and made anew after a fork."""
    global _session
    pid = os.getpid()
    with _session_lock:
        if _session is None or _session[0] != pid:
            # The parent's session is dropped, not closed: closing would shut sockets the
            # parent still uses.
            _session = (pid, new_session())
        return _session[1]


def _after_fork_in_child() -> None:
    global _session_lock
    # A thread of the parent may have held the lock at the fork; the child starts clean.
    _session_lock = threading.Lock()


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
) -> HttpResult:
    """Send `request` and read at most max_body_bytes of the response.

    Redirects are followed by hand, at most MAX_REDIRECTS, and only to the same origin (scheme,
    host and port): the request may carry credentials for that origin alone. Any other redirect
    is the result. Network failures are results with an error_kind; a URL requests cannot
    send to raises ValueError (naming the URL with its query values masked).
    """
    started = time.monotonic()
    deadline = None if total_timeout is None else started + total_timeout
    method, url, body = request.method, request.url, request.body
    headers = dict(request.headers)
    redirects = 0
    status: int | None = None
    response_headers: dict[str, str] = {}
    chunks: list[bytes] = []

    def result(**fields: Any) -> HttpResult:
        return HttpResult(
            status_code=status,
            headers=response_headers,
            body=b"".join(chunks),
            duration=time.monotonic() - started,
            url=url,
            redirects=redirects,
            **fields,
        )

    try:
        while True:
            # Each hop starts afresh: a failure after a redirect is that hop's, not the 3xx's.
            status, response_headers = None, {}
            if redirects and deadline is not None and time.monotonic() > deadline:
                raise _TotalTimeout
            response = session.request(
                method,
                url,
                headers=headers,
                data=body,
                timeout=(connect_timeout, read_timeout),
                allow_redirects=False,
                stream=True,
                proxies=get_environ_proxies(url),
            )
            try:
                status, response_headers = response.status_code, dict(response.headers)
                target = _redirect_target(response, url)
                if target is not None and redirects < MAX_REDIRECTS:
                    redirects += 1
                    method, body, headers = _redirected(response.status_code, method, body, headers)
                    url = target
                    continue
                truncated = _read_capped(response, chunks, max_body_bytes, deadline)
                return result(truncated=truncated)
            finally:
                response.close()
    except _TotalTimeout:
        return result(
            truncated=bool(chunks),
            error_kind="timeout",
            error=f"no complete response from {_where(url)} within {total_timeout}s in total",
        )
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if isinstance(exc, ValueError):  # InvalidURL, MissingSchema, ...: the caller's bug
            # requests' message quotes the URL (and a bad header's value): say it without them.
            raise ValueError(
                f"cannot send {request.method} {redact_url(url)}: {type(exc).__name__}"
            ) from None
        kind, message = _describe(
            exc, url, connect_timeout=connect_timeout, read_timeout=read_timeout
        )
        return result(error_kind=kind, error=message)


def _read_capped(
    response: requests.Response, chunks: list[bytes], limit: int, deadline: float | None
) -> bool:
    """Append up to `limit` bytes of the (decoded) body to `chunks`; whether there was more.

    read1 returns whatever one read of the socket gave, so the deadline is checked as bytes
    trickle in (iter_content would block until a whole chunk arrived), and what arrived before
    a failure is kept. It also decompresses no more than it is asked for."""
    size = 0
    while chunk := response.raw.read1(CHUNK_BYTES, decode_content=True):
        if size + len(chunk) > limit:
            chunks.append(chunk[: limit - size])
            return True
        chunks.append(chunk)
        size += len(chunk)
        if deadline is not None and time.monotonic() > deadline:
            raise _TotalTimeout
    return False


def _redirect_target(response: requests.Response, url: str) -> str | None:
    """The same-origin URL a redirect points at; None for anything else (not a redirect, no
    Location, another origin), which is then the result as it is."""
    location = response.headers.get("Location")
    if response.status_code not in _REDIRECTS or not location:
        return None
    try:
        target = urljoin(url, location.strip())
        return target if _origin(target) == _origin(url) else None
    except ValueError:
        return None


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
    scheme, host, port = _origin(url)
    return f"{scheme}://{host}:{port}"


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


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


_CONNECT_FAILURES = (
    urllib3.exceptions.NewConnectionError,  # refused, unreachable, DNS (NameResolutionError)
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
