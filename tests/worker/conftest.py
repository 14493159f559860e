from __future__ import annotations

import pytest
import redis

from project.celery import app


@pytest.fixture
def broker(redis_url):
    """The test's Redis as the broker, its queues empty before and after."""
    app.conf.broker_url = redis_url
    app.control.purge()
    client = redis.Redis.from_url(redis_url)
    yield client
    app.control.purge()
    client.close()
