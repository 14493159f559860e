"""Sign-in throttle: failed passwords and tokens counted per account and per client address in
the cache every web process shares, and sign-ins refused while a count is over its limit."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError

logger = logging.getLogger(__name__)

# Every key this module writes in the cache starts with this (under the cache's KEY_PREFIX):
# deleting them lifts every lock at once.
KEY_PREFIX = "login-throttle"
# An IPv6 client is usually given a whole /64 and can pick any address in it at will; counted
# per address it would have 2**64 fresh counts.
IPV6_CLIENT_PREFIX = 64


# -- counting (the cache is injected; nothing here reads settings) --------------------------


@dataclass(frozen=True)
class Limit:
    """One count of failures: what it counts ("account" or "address"), its cache key, and how
    many failures a window allows (0: no limit)."""

    kind: str
    key: str
    failures: int


@dataclass(frozen=True)
class Lock:
    kind: str
    failures: int  # the limit reached
    retry_after: float  # seconds until its window ends


class FailureCounts:
    """Failures counted per key over a fixed window of `window` seconds from the key's first
    failure; a key with its limit of failures is locked until that window ends. Attempts
    refused while locked are not failures: they neither extend the lock nor count.

    It never raises: when the cache fails, nothing is counted and nothing is locked, with a
    warning. Signing in must not depend on the cache (Redis restarting would lock everyone out
    of the admin that shows it); passwords are still checked, and a few minutes of unthrottled
    guessing at PBKDF2's speed (hundreds of milliseconds a guess) is a small window."""

    def __init__(self, cache: Any, *, window: float, clock: Callable[[], float] = time.time):
        self._cache = cache
        self._window = window
        self._clock = clock

    def lock(self, limits: Sequence[Limit]) -> Lock | None:
        """The longest lock among `limits`, or None."""
        limits = [limit for limit in limits if limit.failures > 0]
        if not limits:
            return None
        try:
            stored = self._cache.get_many([name for limit in limits for name in _names(limit)])
        except Exception as exc:  # whatever CACHES names raises its own errors
            _cache_failed(exc)
            return None
        now = self._clock()
        locks = []
        for limit in limits:
            count_name, end_name = _names(limit)
            count, end = stored.get(count_name), stored.get(end_name)
            # A count without its window's end is a leftover (see _count): it locks nothing.
            if count is not None and end is not None and count >= limit.failures and end > now:
                locks.append(Lock(limit.kind, limit.failures, end - now))
        return max(locks, key=lambda lock: lock.retry_after, default=None)

    def fail(self, limits: Sequence[Limit]) -> list[Limit]:
        """Count one failure against each of `limits`; returns those it brought to their limit."""
        reached = []
        try:
            for limit in limits:
                if limit.failures > 0 and self._count(limit) == limit.failures:
                    reached.append(limit)
        except Exception as exc:
            _cache_failed(exc)
        return reached

    def _count(self, limit: Limit) -> int:
        count_name, end_name = _names(limit)
        timeout = math.ceil(self._window)
        # The window's end is its own key, written once by the window's first failure (add is
        # atomic), so every web process reads the same end whatever its clock says of the
        # count's age. That failure also replaces any count left over: Django's incr checks the
        # key exists, then increments it, and a key expiring in between comes back without an
        # expiry. Such a leftover never locks (lock() wants the end too) and goes at the next
        # window's start. Failures racing the first one of a window may go uncounted; never
        # more than there were.
        if self._cache.add(end_name, self._clock() + self._window, timeout=timeout):
            self._cache.set(count_name, 1, timeout=timeout)
            return 1
        try:
            return self._cache.incr(count_name)
        except ValueError:  # the count went a moment before its window's end
            self._cache.set(count_name, 1, timeout=timeout)
            return 1


def _names(limit: Limit) -> tuple[str, str]:
    return f"{limit.key}:failures", f"{limit.key}:end"


def _cache_failed(exc: Exception) -> None:
    logger.warning("login throttle: the cache failed, not counting: %s", exc)


# -- who is signing in --------------------------------------------------------------------


def client_address(meta: Any, *, trusted_proxies: int) -> str:
    """The address a request came from, as counted: REMOTE_ADDR; or, behind `trusted_proxies`
    proxies that each append the address they saw to X-Forwarded-For, the entry the outermost
    of them appended (the `trusted_proxies`-th from the right; entries further left are
    whatever the client sent, and anyone can send any). An IPv6 address counts as its /64.
    `meta` is a request's META."""
    remote = str(meta.get("REMOTE_ADDR", ""))
    seen = remote
    if trusted_proxies > 0:
        hops = [hop.strip() for hop in str(meta.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
        hops = [hop for hop in hops if hop]
        if hops:
            # Fewer entries than proxies: the request came in past the outer ones, and the
            # first entry is what the first proxy it met saw.
            seen = hops[-min(trusted_proxies, len(hops))]
    return _counted_address(seen) or _counted_address(remote) or "unknown"


def _counted_address(text: str) -> str | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [2001:db8::1]:443
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # 192.0.2.1:443
        text = text.split(":")[0]
    try:
        address = ipaddress.ip_address(text.split("%")[0])  # no IPv6 zone
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/{IPV6_CLIENT_PREFIX}", strict=False))
    return str(address)


def _digest(text: str) -> str:
    # Usernames as typed are anyone's input: hashed, no key holds them (or their length).
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _account_key(username: str) -> str:
    # "Alice" and "alice" are one count: a user model whose lookup ignores case must not give
    # a guesser a fresh count per spelling.
    return f"{KEY_PREFIX}:account:{_digest(unicodedata.normalize('NFKC', username).casefold())}"


# -- Django: what settings say, the authentication backend and the admin's form -------------


def failure_counts() -> FailureCounts:
    return FailureCounts(cache, window=settings.RATEJOBS_LOGIN_LOCKOUT_SECONDS)


def request_address(request: Any) -> str:
    return client_address(request.META, trusted_proxies=settings.RATEJOBS_TRUSTED_PROXY_COUNT)


def password_limits(username: str, address: str | None) -> list[Limit]:
    """Wrong passwords are counted per username tried, and per address (when there is a
    request) so that one address cannot try a few passwords on each of many accounts."""
    limits = [
        Limit("account", _account_key(username), settings.RATEJOBS_LOGIN_FAILURES_PER_ACCOUNT)
    ]
    if address is not None:
        key = f"{KEY_PREFIX}:password-address:{address}"
        limits.append(Limit("address", key, settings.RATEJOBS_LOGIN_FAILURES_PER_ADDRESS))
    return limits


def token_limits(address: str) -> list[Limit]:
    """Bad tokens are counted per address, apart from wrong passwords: an API client stuck on a
    revoked token must not lock its office out of the admin, nor the reverse."""
    key = f"{KEY_PREFIX}:token-address:{address}"
    return [Limit("address", key, settings.RATEJOBS_LOGIN_FAILURES_PER_ADDRESS)]


def log_refused(lock: Lock, *, address: str | None, username: str | None = None) -> None:
    """One WARNING per sign-in refused by a lock: what was tried, for whom and from where,
    never a password or a token (%r keeps a username's newlines out of the log's lines)."""
    fields = {
        "username": username,
        "address": address,
        "locked": lock.kind,
        "retry_after": math.ceil(lock.retry_after),
    }
    if username is None:
        message = "login throttle: refused a token from %(address)s: the address is locked"
    else:
        message = (
            "login throttle: refused a password for %(username)r from %(address)s: "
            "the %(locked)s is locked"
        )
    logger.warning(message + " for %(retry_after)d s more", fields, extra=fields)


def log_reached(limit: Limit, *, address: str | None, username: str | None = None) -> None:
    """One WARNING when a failure locks an account or an address."""
    fields = {
        "username": username,
        "address": address,
        "locked": limit.kind,
        "failures": limit.failures,
    }
    if username is None:
        message = "login throttle: a bad token from %(address)s locked the address"
    else:
        message = (
            "login throttle: a wrong password for %(username)r from %(address)s "
            "locked the %(locked)s"
        )
    logger.warning(message + " (%(failures)d failures)", fields, extra=fields)


def wait_text(seconds: float) -> str:
    if seconds < 60:
        count, unit = max(1, math.ceil(seconds)), "second"
    else:
        count, unit = math.ceil(seconds / 60), "minute"
    return f"{count} {unit}{'' if count == 1 else 's'}"


def lock_message(lock: Lock) -> str:
    whose = "for this account" if lock.kind == "account" else "from your address"
    return (
        f"Too many failed sign-ins {whose}. Try again in {wait_text(lock.retry_after)}; "
        "until then signing in is refused, even with the right password."
    )


class ThrottledModelBackend(ModelBackend):
    """Django's ModelBackend behind the throttle, so every way of signing in with a password
    (the admin's page, a test client, any authenticate() call) is counted and refused alike:
    while the username
    or the address is locked the password is not even checked, the right one is refused too
    (or the lock would be no lock: the guess that succeeds would get in). A right password
    is not a failure and does not reset the counts: an attacker holding one account must
    not wipe their address's count with it."""

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None  # as ModelBackend does
        address = request_address(request) if request is not None else None
        limits = password_limits(username, address)
        counts = failure_counts()
        lock = counts.lock(limits)
        if lock is not None:
            log_refused(lock, username=username, address=address)
            raise PermissionDenied(lock_message(lock))  # no later backend either
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            for limit in counts.fail(limits):
                log_reached(limit, username=username, address=address)
        return user


class ThrottledAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin's sign-in form, saying how long to wait when the backend refused a locked
    username or address, or when this failure locked one (Django's own error otherwise)."""

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except ValidationError:
            username = self.cleaned_data.get("username")
            if not username or "password" not in self.cleaned_data:
                raise
            address = request_address(self.request) if self.request is not None else None
            lock = failure_counts().lock(password_limits(username, address))
            if lock is None:
                raise
            raise ValidationError(lock_message(lock), code="throttled") from None
