"""Where a request may connect, and the connections kept for it: sessions whose urllib3
connections resolve the host themselves and connect only to addresses the outbound policy
allows, pooled per host and made anew in a forked child, and the proxy the environment sets."""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.cookiejar import DefaultCookiePolicy
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3.exceptions
from requests.adapters import DEFAULT_POOLBLOCK, HTTPAdapter
from requests.utils import get_environ_proxies, select_proxy
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import PoolManager, ProxyManager
from urllib3.util.connection import allowed_gai_family

from ratejobs.execution import watchdog
from ratejobs.execution.outbound import (
    OutboundPolicy,
    Resolver,
    connect_allowed,
    refused_address,
)
from ratejobs.execution.request import merge_headers

# Connections kept per host when the caller does not say: a worker process passes the number
# of calls it keeps in flight, so none of its threads opens a connection only to drop it...
POOL_MAXSIZE = 10
# ... and it keeps connections to this many hosts (a worker serves many APIs over its life).
POOL_HOSTS = 10
USER_AGENT = "ratejobs/0.1 (+https://github.com/ratejobs)"


class _NoCookies(DefaultCookiePolicy):
    """One session serves every job in the process: a cookie one API call set must never ride
    along on another job's call to the same host."""

    def set_ok(self, cookie: Any, request: Any) -> bool:
        return False

    def return_ok(self, cookie: Any, request: Any) -> bool:
        return False


# --- connect-time address policy and the watchdog, inside urllib3 ----------------------


@dataclass(frozen=True)
class _Outbound:
    policy: OutboundPolicy
    resolver: Resolver


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
        self._watched_by: watchdog.Watchdog | None = None

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
        dog = watchdog.current()
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
    global _session_lock
    # A thread of the parent may have held the lock at the fork: the child starts clean.
    _session_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- one request on the pools, through the proxy from the environment ---------------------


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


def open_response(
    session: requests.Session,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout: tuple[float, float],
) -> urllib3.BaseHTTPResponse:
    """Send one request (a redirect is not followed) on `session`, a session from
    new_session(), through the proxy the environment sets for `url` if any; the response's
    body is left unread. Raises AddressRefused for a target the outbound policy refuses, and
    what urllib3, requests and the socket raise for a failure to send.

    It sends on the session's policed connection pools as requests' adapter does, without
    Session.request: preparing each request there (merging settings, re-parsing and
    re-quoting a URL already built and checked) cost a third of a worker's CPU per call in
    bench-jobs."""
    proxies = _environ_proxies(url)
    _check_through_proxy(session, url, proxies)
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
