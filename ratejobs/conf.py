"""ratejobs' settings: each one's default, the checks on them, and how a host project gets them.

A host project (or this checkout's `project/`) sets only what it changes, as Django settings of
the same names; `RatejobsConfig` fills in the rest when Django starts (`install`), so
`INSTALLED_APPS += [..., "ratejobs"]` and a Redis URL is a working configuration. A project
that reads its configuration from the environment, as `project/` does, takes every setting
below from the variable of the same name with `from_environment` (docs/configuration.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ratejobs.execution.backoff import backoff_ceiling
from ratejobs.execution.outbound import OutboundPolicy
from ratejobs.limiter.deployment import check_namespace, namespace_for_database

MIB = 1024 * 1024
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class Setting:
    """One setting: its name (the environment variable's too), how a variable's text becomes
    its value (django-environ's casts: str, int, float, bool, list), and its default: a value,
    or a function of the settings resolved before it (those listed earlier)."""

    name: str
    cast: str
    default: Any

    def default_from(self, resolved: Mapping[str, Any]) -> Any:
        return self.default(resolved) if callable(self.default) else self.default


def _redis_url(given: Mapping[str, Any]) -> str:
    """A host whose broker is a Redis keeps the limiters there too, unless it says otherwise."""
    broker = str(given.get("CELERY_BROKER_URL") or "")
    return broker if broker.startswith(("redis://", "rediss://")) else DEFAULT_REDIS_URL


def _namespace(given: Mapping[str, Any]) -> str:
    # A hash of the database: deployments with different databases on one Redis never share
    # state by accident (ratejobs.limiter.deployment).
    return namespace_for_database(given["DATABASES"]["default"])


def _callback_deadline(given: Mapping[str, Any]) -> float:
    # The longest the backoff waits over all the attempts, plus for each attempt its timeout
    # and a minute of queues and the reconciler's pick-up (3,290 s with the defaults), so the
    # backoff alone never reaches it.
    attempts = given["RATEJOBS_CALLBACK_MAX_ATTEMPTS"]
    base, cap = given["RATEJOBS_CALLBACK_BACKOFF_BASE"], given["RATEJOBS_CALLBACK_BACKOFF_CAP"]
    backoff = sum(backoff_ceiling(n, base=base, cap=cap) for n in range(attempts - 1))
    return backoff + attempts * (given["RATEJOBS_CALLBACK_TIMEOUT"] + 60.0)


# What each one does is in docs/configuration.md; the comments say why a default is what it is.
SETTINGS: tuple[Setting, ...] = (
    # The shared limiter state; Sentinel (REDIS_URL then gives the database and password) or
    # Cluster for high availability (docs/operations.md, "Several machines").
    Setting("REDIS_URL", "str", _redis_url),
    Setting("REDIS_SENTINELS", "list", []),
    Setting("REDIS_SENTINEL_MASTER", "str", ""),
    Setting("REDIS_CLUSTER", "bool", False),
    # The cache the web processes share, where the job-creation and sign-in throttles count
    # (a per-process cache would multiply their limits by the number of processes).
    Setting("RATEJOBS_CACHE_URL", "str", lambda s: s["REDIS_URL"]),
    Setting("RATEJOBS_NAMESPACE", "str", _namespace),
    # Empty: RATEJOBS_NAMESPACE. The same value on two deployments shares their limiters (one
    # quota) on purpose, while their queues, dispatch keys and cache stay apart.
    Setting("RATEJOBS_LIMITER_NAMESPACE", "str", ""),
    # Empty: derived from SECRET_KEY.
    Setting("RATEJOBS_CREDENTIALS_KEY", "str", ""),
    Setting("RATEJOBS_CREDENTIAL_ENV_ALLOW", "list", []),
    Setting("RATEJOBS_MAX_CALLS_PER_REQUEST", "int", 100_000),
    Setting("RATEJOBS_MAX_CALL_BODY_BYTES", "int", MIB),
    Setting("RATEJOBS_MAX_RESPONSE_BYTES", "int", MIB),
    # Loopback, private and link-local addresses (cloud metadata) are refused unless listed.
    Setting("RATEJOBS_OUTBOUND_ALLOW", "list", []),
    # Any user may set a callback_url, only managers configure APIs: a list of its own.
    Setting("RATEJOBS_CALLBACK_ALLOW", "list", []),
    # The broker holds at most these seconds of an API's work, so a million calls never flood
    # it; bounded below so every worker has something to take.
    Setting("RATEJOBS_DISPATCH_WINDOW_SECONDS", "float", 2.0),
    Setting("RATEJOBS_DISPATCH_WINDOW_MIN", "int", 16),
    Setting("RATEJOBS_DISPATCH_WINDOW_MAX", "int", 1000),
    # Longer waits go back to the database (a long countdown in a Redis broker runs twice);
    # also how soon a call waiting for its slot notices a pause or cancel.
    Setting("RATEJOBS_MAX_WORKER_WAIT", "float", 1.0),
    # 64 calls/s per process at a 1 s response time; a thread costs about 100 KiB.
    Setting("RATEJOBS_CALLS_IN_FLIGHT", "int", 64),
    Setting("RATEJOBS_CALLS_PER_MESSAGE", "int", 64),
    # Dead-after is above the longest pause a busy process may have (a database failover).
    Setting("RATEJOBS_WORKER_HEARTBEAT_SECONDS", "float", 5.0),
    Setting("RATEJOBS_WORKER_DEAD_AFTER", "float", 30.0),
    # By default no workers is "degraded" (200): a web container is not restarted for want of
    # workers.
    Setting("RATEJOBS_HEALTH_REQUIRE_WORKERS", "bool", False),
    Setting("RATEJOBS_RECONCILE_INTERVAL", "float", 30.0),
    Setting("RATEJOBS_STALE_DISPATCH_SECONDS", "float", 120.0),
    # Each retention run works a minute at most.
    Setting("RATEJOBS_RETENTION_INTERVAL", "float", 600.0),
    # 8 attempts spread over about 23 to 46 minutes (equal jitter).
    Setting("RATEJOBS_CALLBACK_MAX_ATTEMPTS", "int", 8),
    Setting("RATEJOBS_CALLBACK_BACKOFF_BASE", "float", 30.0),
    Setting("RATEJOBS_CALLBACK_BACKOFF_CAP", "float", 900.0),
    Setting("RATEJOBS_CALLBACK_TIMEOUT", "float", 10.0),
    Setting("RATEJOBS_CALLBACK_DEADLINE_SECONDS", "float", _callback_deadline),
    Setting("RATEJOBS_KEEP_EVENTS_DAYS", "int", 30),
    Setting("RATEJOBS_KEEP_BODIES_DAYS", "int", 30),
    Setting("RATEJOBS_LOG_FORMAT", "str", "text"),
    Setting("RATEJOBS_LOG_LEVEL", "str", "INFO"),
    Setting("RATEJOBS_FLOWER_URL", "str", ""),
    # /metrics' labels name every API: without a token it answers nobody unless made public.
    Setting("RATEJOBS_METRICS_TOKEN", "str", ""),
    Setting("RATEJOBS_METRICS_PUBLIC", "bool", False),
    # 100,000 calls of about 80 bytes; larger jobs go to the upload route, line by line.
    Setting("RATEJOBS_MAX_REQUEST_BYTES", "int", 8 * MIB),
    Setting("RATEJOBS_MAX_UPLOAD_BYTES", "int", 256 * MIB),
    Setting("RATEJOBS_MAX_CALLS_PER_UPLOAD", "int", 1_000_000),
    Setting("RATEJOBS_MAX_PAGE_BYTES", "int", 8 * MIB),
    # Per user, superusers included: the limits protect the machine, not data.
    Setting("RATEJOBS_JOB_CREATE_RATE", "str", "60/min"),
    Setting("RATEJOBS_MAX_ACTIVE_JOBS_PER_USER", "int", 100),
    Setting("RATEJOBS_MAX_PENDING_CALLS_PER_USER", "int", 2_000_000),
    Setting("RATEJOBS_KEPT_UPLOAD_MAX_BYTES", "int", 16 * MIB),
    Setting("RATEJOBS_KEPT_UPLOADS_MAX_TOTAL_BYTES", "int", 256 * MIB),
    # The address limit is the higher: it stops one address trying a few passwords on many
    # usernames, and still lets one office's people mistype theirs.
    Setting("RATEJOBS_LOGIN_FAILURES_PER_ACCOUNT", "int", 10),
    Setting("RATEJOBS_LOGIN_FAILURES_PER_ADDRESS", "int", 50),
    Setting("RATEJOBS_LOGIN_LOCKOUT_SECONDS", "int", 15 * 60),
    # 0 trusts no X-Forwarded-For: anyone can send one.
    Setting("RATEJOBS_TRUSTED_PROXY_COUNT", "int", 0),
)
NAMES = tuple(setting.name for setting in SETTINGS)
# What the derived defaults read besides ratejobs' own settings.
HOST_SETTINGS = ("DATABASES", "CELERY_BROKER_URL")


def default(name: str) -> Any:
    """The default of a setting whose default is a value (not derived from others)."""
    (setting,) = (setting for setting in SETTINGS if setting.name == name)
    if callable(setting.default):
        raise ValueError(f"{name}'s default is derived from other settings")
    return setting.default


def from_environment(env: Any) -> dict[str, Any]:
    """The settings whose environment variable is set, cast as their defaults are, with `env` a
    django-environ `Env` (lists are comma-separated)."""
    found = {}
    for setting in SETTINGS:
        # Empty is unset for a default derived from others (RATEJOBS_NAMESPACE= in a .env).
        if env.ENVIRON.get(setting.name, "") == "" and callable(setting.default):
            continue
        if setting.name in env.ENVIRON:
            read: Callable[..., Any] = getattr(env, setting.cast)
            found[setting.name] = read(setting.name)
    return found


def resolve(given: Mapping[str, Any]) -> dict[str, Any]:
    """Every ratejobs setting: the given ones over the defaults, the derived defaults computed
    from what was resolved before them, then checked; a bad value stops every process as it
    starts (ImproperlyConfigured), not a worker at its first call."""
    resolved: dict[str, Any] = {name: given[name] for name in HOST_SETTINGS if name in given}
    for setting in SETTINGS:
        if setting.name in given:
            resolved[setting.name] = given[setting.name]
        else:
            resolved[setting.name] = setting.default_from(resolved)
    check(resolved)
    return {name: resolved[name] for name in NAMES}


def check(resolved: Mapping[str, Any]) -> None:
    """ImproperlyConfigured naming the first setting that cannot work."""
    try:
        check_namespace(resolved["RATEJOBS_NAMESPACE"])
        if resolved["RATEJOBS_LIMITER_NAMESPACE"]:
            check_namespace(resolved["RATEJOBS_LIMITER_NAMESPACE"])
        OutboundPolicy.from_allow_list(resolved["RATEJOBS_OUTBOUND_ALLOW"])
        OutboundPolicy.from_allow_list(
            resolved["RATEJOBS_CALLBACK_ALLOW"], setting="RATEJOBS_CALLBACK_ALLOW"
        )
    except ValueError as error:
        raise ImproperlyConfigured(str(error)) from error
    if resolved["RATEJOBS_LOGIN_LOCKOUT_SECONDS"] < 1:
        raise ImproperlyConfigured("RATEJOBS_LOGIN_LOCKOUT_SECONDS must be at least 1")
    if resolved["REDIS_CLUSTER"] and resolved["RATEJOBS_CACHE_URL"] == resolved["REDIS_URL"]:
        # Django's Redis cache speaks to one server: on a Cluster node every other slot's key
        # is a MOVED error, and the sign-in and job-creation throttles counted nothing.
        raise ImproperlyConfigured(
            "REDIS_CLUSTER: Django's cache cannot use a Redis Cluster; set RATEJOBS_CACHE_URL "
            "to a plain Redis (the broker's will do)"
        )


def install() -> None:
    """Give Django's settings every ratejobs setting the host left out (its defaults, checked),
    before any of ratejobs' modules read them: called as the app is created."""
    from django.conf import settings

    given = {
        name: getattr(settings, name)
        for name in (*HOST_SETTINGS, *NAMES)
        if hasattr(settings, name)
    }
    for name, value in resolve(given).items():
        if name not in given:
            setattr(settings, name, value)
