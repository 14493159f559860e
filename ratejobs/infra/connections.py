"""Connections to Redis: the process's one client for the limiter, the dispatcher's wake-ups
and the health check, to a plain Redis, a Sentinel-named master or a Redis Cluster."""

from __future__ import annotations

import functools
from typing import Any

import redis
from django.conf import settings
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel, SentinelConnectionPool

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
    url: str,
    *,
    sentinels: list[str],
    sentinel_master: str,
    cluster: bool,
    timeout: float = REDIS_SOCKET_TIMEOUT,
) -> redis.Redis | RedisCluster:
    timeouts = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if cluster:
        return RedisCluster.from_url(url, **timeouts)
    if sentinels:
        sentinel = _sentinel(sentinels, timeouts)
        return sentinel.master_for(sentinel_master, health_check_interval=30, **_master_kwargs(url))
    return redis.Redis.from_url(url, health_check_interval=30, **timeouts)


def _sentinel(sentinels: list[str], timeouts: dict[str, float]) -> Sentinel:
    hosts = [(h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in sentinels]
    return Sentinel(hosts, sentinel_kwargs=timeouts, **timeouts)


def _master_kwargs(url: str) -> dict[str, Any]:
    """What a URL says of a Sentinel-named master: its database, user and password (its host
    and port are the Sentinels' to say)."""
    return {k: v for k, v in redis.connection.parse_url(url).items() if k not in ("host", "port")}


class SentinelMasterPool(SentinelConnectionPool):
    """Django's RedisCache `pool_class` for the master the settings' Sentinels name (its URL
    gives the database and password only): a cache on REDIS_URL's server stayed on the first
    master after a failover, and the sign-in and job-submission throttles counted nothing
    (bench/scale's sentinel-failover row)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SentinelMasterPool:
        timeouts = {
            name: options[name]
            for name in ("socket_timeout", "socket_connect_timeout")
            if name in options
        }
        sentinel = _sentinel(settings.REDIS_SENTINELS, timeouts)
        return cls(settings.REDIS_SENTINEL_MASTER, sentinel, **_master_kwargs(url), **options)
