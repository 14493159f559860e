"""The services reach the limiter's Redis through Sentinel or on a Cluster, as the settings
say (REDIS_SENTINELS with REDIS_SENTINEL_MASTER, or REDIS_CLUSTER): real servers each time."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.core.cache.backends.redis import RedisCache

from devtools import devredis
from ratejobs.infra import connections
from ratejobs.infra.connections import connect_redis
from ratejobs.limiter import Limiter, LimiterConfig
from tests.limiter.test_cluster import one_node_cluster


def exercise(client) -> None:
    """Everything a worker does with the limiter, on `client`."""
    limiter = Limiter(client, "ha-mode", LimiterConfig(rate=100, burst=1, max_concurrency=1))
    with limiter.slot(max_wait=1.0):
        assert limiter.state().in_flight == 1
    with limiter.slot(max_wait=1.0):
        pass
    assert limiter.state().counts.grants == 2
    limiter.reset()


@pytest.fixture
def sentinel(tmp_path: Path):
    """A master and one Sentinel watching it as `ratejobs-master`."""
    master = devredis.start_private_redis()
    port = devredis.free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor ratejobs-master 127.0.0.1 {urlsplit(master.url).port} 1\n"
    )
    process = subprocess.Popen(
        [devredis.server_binary(), str(config), "--sentinel"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not devredis.answers(f"redis://127.0.0.1:{port}/0"):
            assert time.monotonic() < deadline, "sentinel did not start"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", master
    finally:
        process.terminate()
        process.wait(10)
        master.stop()


def test_the_limiter_reaches_its_redis_through_sentinel(sentinel, settings):
    address, master = sentinel
    client = connect_redis(
        "redis://127.0.0.1:1/2", sentinels=[address], sentinel_master="ratejobs-master",
        cluster=False,
    )  # fmt: skip
    exercise(client)
    # the Sentinel found the master: the limiter's keys are there, in database 2
    assert client.connection_pool.get_master_address()[1] == urlsplit(master.url).port
    # and the services use it when the settings say so
    settings.REDIS_SENTINELS = [address]
    settings.REDIS_SENTINEL_MASTER = "ratejobs-master"
    connections.redis_client.cache_clear()
    try:
        assert connections.redis_client().ping()
    finally:
        connections.redis_client.cache_clear()


@pytest.mark.slow
def test_the_limiter_runs_on_a_cluster_from_the_settings(settings):
    with one_node_cluster() as url:
        settings.REDIS_URL, settings.REDIS_CLUSTER = url, True
        connections.redis_client.cache_clear()
        try:
            client = connections.redis_client()
            assert type(client).__name__ == "RedisCluster"
            exercise(client)
            client.close()
        finally:
            connections.redis_client.cache_clear()


def test_the_cache_reaches_the_master_the_sentinels_name(sentinel, settings):
    # given Sentinels naming the master, and a cache URL whose host is nobody's (as REDIS_URL
    # is with Sentinels: only its database and password count)
    address, master = sentinel
    settings.REDIS_SENTINELS = [address]
    settings.REDIS_SENTINEL_MASTER = "ratejobs-master"
    options = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0}
    cache = RedisCache(
        "redis://127.0.0.1:1/2",
        {"OPTIONS": {**options, "pool_class": "ratejobs.infra.connections.SentinelMasterPool"}},
    )
    # when the sign-in throttle counts in it
    cache.set("attempts", 3, 30)
    # expect: the count is on the master the Sentinel named, in the URL's database
    assert cache.get("attempts") == 3
    port = urlsplit(master.url).port
    assert redis.Redis(host="127.0.0.1", port=port, db=2).get(":1:attempts") is not None
