"""Connections to Redis: the process's one client for the limiter, the dispatcher's wake-ups
and the health check, to a plain Redis, a Sentinel-named master or a Redis Cluster."""

from __future__ import annotations

import functools

import redis
from django.conf import settings
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

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
        # The URL still carries the database, user and password of the master.
        kwargs = redis.connection.parse_url(url)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("host", "port")}
        hosts = [(h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in sentinels]
        sentinel = Sentinel(hosts, sentinel_kwargs=timeouts, **timeouts)
        return sentinel.master_for(sentinel_master, health_check_interval=30, **kwargs)
    return redis.Redis.from_url(url, health_check_interval=30, **timeouts)
