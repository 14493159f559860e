"""Writes on APIs, and the shared limiter each one is paced by."""

from __future__ import annotations

import functools
import logging
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from ratejobs.credentials import encrypt_secret
from ratejobs.execution.urls import validate_base_url
from ratejobs.limiter import Feedback, Limiter
from ratejobs.models import Api, ThrottleEvent

logger = logging.getLogger(__name__)

# Limits the REST API and the admin may change on a live API.
EDITABLE_FIELDS = (
    "base_url",
    "rate",
    "period",
    "burst",
    "max_concurrency",
    "adaptive",
    "min_rate",
    "max_attempts",
    "max_throttled_retries",
    "timeout",
    "default_headers",
    "auth_header",
    "credential_env",
)
# Redis calls from the web and workers give up after this long, so a dead Redis turns into a
# LimiterUnavailable quickly instead of a hung worker.
REDIS_SOCKET_TIMEOUT = 5.0


@functools.cache
def redis_client() -> redis.Redis | RedisCluster:
    """One client per process (redis-py's pools are fork-safe), for a plain Redis, the master
    a set of Sentinels names, or a Redis Cluster, as the settings say."""
    return connect_redis(
        settings.REDIS_URL,
        sentinels=settings.REDIS_SENTINELS,
        sentinel_master=settings.REDIS_SENTINEL_MASTER,
        cluster=settings.REDIS_CLUSTER,
    )


def connect_redis(
    url: str, *, sentinels: list[str], sentinel_master: str, cluster: bool
) -> redis.Redis | RedisCluster:
    timeouts = {
        "socket_timeout": REDIS_SOCKET_TIMEOUT,
        "socket_connect_timeout": REDIS_SOCKET_TIMEOUT,
    }
    if cluster:
        return RedisCluster.from_url(url, **timeouts)
    if sentinels:
        # The URL still carries the database, user and password of the master.
        kwargs = redis.connection.parse_url(url)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("host", "port")}
        hosts = [(h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in sentinels]
        sentinel = Sentinel(hosts, sentinel_kwargs=timeouts, **timeouts)
        return sentinel.master_for(sentinel_master, health_check_interval=30, **kwargs)
    return redis.Redis.from_url(url, health_check_interval=30, **timeouts)


_limiters: dict[str, Limiter] = {}


def api_limiter(api: Api) -> Limiter:
    """The shared limiter for `api`, carrying its current limits (to restore them after Redis
    lost them); one Limiter object per API per process."""
    limiter = _limiters.get(api.name)
    if limiter is None:
        limiter = _limiters[api.name] = Limiter(redis_client(), api.name)
    limiter.config = api.limiter_config()
    return limiter


def _validate(api: Api) -> None:
    api.full_clean()
    try:  # stricter than URLField: http(s) only, no credentials, query or dot segments
        validate_base_url(api.base_url)
    except ValueError as exc:
        raise ValidationError({"base_url": str(exc)}) from exc
    try:
        api.limiter_config()
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc
    if not isinstance(api.default_headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in api.default_headers.items()
    ):
        raise ValidationError({"default_headers": "must map header names to string values"})


@transaction.atomic
def api_create(*, credential: str | None = None, **fields: Any) -> Api:
    api = Api(**fields)
    if credential:
        api.credential_encrypted = encrypt_secret(credential)
    _validate(api)
    api.save()
    # robust: with Redis down the API is still saved; workers configure the limiter from
    # the database when they first use it.
    transaction.on_commit(lambda: api_limiter(api).configure(api.limiter_config()), robust=True)
    return api


@transaction.atomic
def api_update(*, api: Api, credential: str | None = None, **fields: Any) -> Api:
    """Change limits live: workers pick them up at their next grant."""
    unknown = set(fields) - set(EDITABLE_FIELDS)
    if unknown:
        raise ValidationError(f"cannot change {', '.join(sorted(unknown))}")
    for name, value in fields.items():
        setattr(api, name, value)
    if credential is not None:
        api.credential_encrypted = encrypt_secret(credential) if credential else ""
    _validate(api)
    api.save()
    transaction.on_commit(lambda: api_limiter(api).configure(api.limiter_config()), robust=True)
    return api


def api_block(*, api: Api, seconds: float) -> Feedback:
    """Stop every worker calling the API for `seconds` (an operator's decision, recorded)."""
    feedback = api_limiter(api).block(seconds)
    ThrottleEvent.objects.create(api=api, kind=ThrottleEvent.Kind.BLOCKED, retry_after=seconds)
    fields = {"api": api.name, "events": str(ThrottleEvent.Kind.BLOCKED), "blocked_for": seconds}
    logger.info("throttle decision: api=%(api)s manual block of every worker for %(blocked_for)gs",
                fields, extra=fields)  # fmt: skip
    return feedback


def api_limiter_reset(*, api: Api) -> None:
    limiter = api_limiter(api)
    limiter.reset()
    limiter.configure(api.limiter_config())
