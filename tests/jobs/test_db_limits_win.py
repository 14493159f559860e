"""The database's limits win: a change made while Redis is down, and a Redis restored from an
older snapshot, reach the shared limiter at the next grant (Api.limits_version)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from devtools.devredis import RedisServer, start_private_redis
from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Api
from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create
from tests.conftest import _forget_redis_clients
from tests.realparts import wait_for_job


@pytest.fixture
def restartable_redis() -> Iterator[list[RedisServer]]:
    """A private Redis the services use, which the test may stop and start again on its port
    (from the dump it saved, as a restore from an older snapshot does)."""
    servers = [start_private_redis()]
    real = settings.REDIS_URL
    settings.REDIS_URL = servers[0].url
    _forget_redis_clients()
    yield servers
    settings.REDIS_URL = real
    _forget_redis_clients()
    servers[-1].stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_rate_lowered_while_redis_was_down_holds_when_it_is_back(
    restartable_redis: list[RedisServer],
    client_for: Any,
    manager: Any,
    sandbox: Any,
    start_worker: Any,
    start_beat: Any,
    unique_name: str,
) -> None:
    url = restartable_redis[0].url
    # given an API at 10/s whose limiter is in Redis (version 1), saved to disk at that point
    server = sandbox(rate=100, burst=10, headers="none")
    api = api_create(name=unique_name, base_url=server.url, rate=10)
    api_limiter(api).acquire()
    assert api_limiter(api).state().config_version == 1
    redis.Redis.from_url(url).save()
    dump = (restartable_redis[0].directory / "dump.rdb").read_bytes()
    # when Redis goes down, an operator lowers the rate to 2/s, and Redis comes back from its dump
    restartable_redis[0].stop()  # which removes its directory
    _forget_redis_clients()
    response = client_for(manager).patch(f"/api/apis/{api.name}/", {"rate": 2}, format="json")
    assert response.status_code == 200, response.content
    api.refresh_from_db()
    assert (api.rate, api.limits_version) == (2.0, 2)
    restartable_redis[0].directory.mkdir()
    (restartable_redis[0].directory / "dump.rdb").write_bytes(dump)
    restartable_redis.append(start_private_redis(port=urlsplit(url).port))
    _forget_redis_clients()
    assert (api_limiter(api).state().rate, api_limiter(api).state().config_version) == (10.0, 1)
    # and real workers run a job against it
    env = {
        "REDIS_URL": url,
        "CELERY_BROKER_URL": url,
        "RATEJOBS_RECONCILE_INTERVAL": "1",
        "RATEJOBS_STALE_DISPATCH_SECONDS": "1",
    }
    start_worker(concurrency=2, **env)
    start_beat(**env)
    calls = [{"method": "GET", "path": f"/items/{i}"} for i in range(6)]
    job = job_create(owner=manager, api=Api.objects.get(pk=api.pk), name="after", calls=calls)
    job = wait_for_job(job, timeout=60)
    # expect: the workers wrote version 2 back, and the sandbox saw 2/s, not 10/s
    state = api_limiter(api).state()
    assert (state.rate, state.config_version) == (2.0, 2)
    assert job.succeeded == 6
    stats = server.stats(window=2.0)
    assert stats["arrivals"] == 6
    # 6 calls at 10/s all fit in one 2 s window; at 2/s (burst 1) no more than 2 s * 2/s + 1
    assert stats["worst_window"] <= 5, stats
