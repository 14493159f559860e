"""Fixtures shared by every test: a Redis that answers, a client for it, a unique name per test.

The database needs nothing here: settings read DATABASE_URL (PostgreSQL in CI) and fall back to
SQLite.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from ratejobs import devredis
from ratejobs.limiter import Limiter, LimiterConfig


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """REDIS_URL if a Redis answers there, else a private redis-server for this session."""
    server = devredis.ensure(os.environ.get("REDIS_URL", devredis.DEFAULT_URL))
    # Subprocesses (workers, spawned test helpers) read it from the environment; Django's
    # settings were read before this ran, so point them at the same server.
    os.environ["REDIS_URL"] = server.url
    from django.conf import settings

    if settings.CELERY_BROKER_URL == settings.REDIS_URL:
        settings.CELERY_BROKER_URL = server.url
    settings.REDIS_URL = server.url
    yield server.url
    server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=False)
    yield client
    client.close()


@pytest.fixture
def unique_name() -> str:
    """A key prefix / limiter name no other test uses, so tests sharing one Redis don't collide."""
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture
def make_limiter(redis_client, unique_name) -> Iterator[Callable[..., Limiter]]:
    """Limiters under this test's unique name, configured when given a config; their keys
    are deleted afterwards."""
    made: list[Limiter] = []

    def make(config: LimiterConfig | None = None, name: str = unique_name) -> Limiter:
        limiter = Limiter(redis_client, name, config)
        if config is not None:
            limiter.configure(config)
        made.append(limiter)
        return limiter

    yield make
    for limiter in made:
        redis_client.delete(*limiter.keys)
