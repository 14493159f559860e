"""Redis unreachable: nothing is granted; the caller gets LimiterUnavailable and retries later."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from devtools.devredis import start_private_redis
from ratejobs.limiter import Limiter, LimiterConfig, LimiterNotConfigured, LimiterUnavailable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_acquire_fails_closed_when_redis_is_down():
    # no client-side retries: the test is about what the limiter does once the client gives up
    client = redis.Redis(
        port=free_port(),
        socket_connect_timeout=0.5,
        socket_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )
    limiter = Limiter(client, "down", LimiterConfig(rate=10))
    with pytest.raises(LimiterUnavailable, match="unreachable"):
        limiter.acquire()
    with pytest.raises(LimiterUnavailable):
        limiter.block(1)
    with pytest.raises(LimiterUnavailable):
        limiter.state()


def test_waiter_is_not_granted_when_redis_dies_during_its_wait():
    # given a private Redis, a waiter holding a slot 2 s away, then Redis stops
    server = start_private_redis()
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
        limiter = Limiter(client, "dies", LimiterConfig(rate=0.5))
        limiter.acquire()
        outcome: dict = {}

        def wait() -> None:
            try:
                outcome["grant"] = limiter.acquire()
            except Exception as exc:
                outcome["error"] = exc

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
    finally:
        server.stop()
    waiter.join(15)
    # expect: an error, never a grant
    assert "grant" not in outcome
    assert isinstance(outcome["error"], LimiterUnavailable)


def test_unconfigured_limiter_says_so(redis_client, unique_name):
    with pytest.raises(LimiterNotConfigured):
        Limiter(redis_client, unique_name).acquire()


def test_a_redis_over_its_maxmemory_is_unavailable_not_an_error():
    # given a private Redis that holds more than its maxmemory (a full broker on the same Redis)
    server = start_private_redis()
    try:
        client = redis.Redis.from_url(server.url)
        limiter = Limiter(client, "full", LimiterConfig(rate=10))
        limiter.acquire()
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", client.info("memory")["used_memory"] // 2)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("one-more", "x")
        # expect: the limiter says Redis cannot serve it (the caller waits; no attempt is used)
        with pytest.raises(LimiterUnavailable, match="out of memory"):
            limiter.acquire()
    finally:
        server.stop()
