"""The limiter runs unchanged on Redis Cluster: every script touches keys of one hash slot."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
from redis.cluster import RedisCluster

from devtools.devredis import free_port, start_private_redis
from ratejobs.limiter import Limiter, LimiterConfig

SLOTS = 16384
# A cluster node also listens on its port + 10000 (the cluster bus).
HIGHEST_CLUSTER_PORT = 55535


def cluster_port() -> int:
    while (port := free_port()) > HIGHEST_CLUSTER_PORT:
        pass
    return port


@contextmanager
def one_node_cluster() -> Iterator[str]:
    """A private one-node Redis Cluster owning every slot; yields its URL. Cross-slot commands
    fail there exactly as on a large cluster."""
    server = start_private_redis(
        extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
        port=cluster_port(),
    )
    try:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("CLUSTER", "ADDSLOTS", *range(SLOTS))
        deadline = time.monotonic() + 10
        while admin.cluster("info")["cluster_state"] != "ok":
            assert time.monotonic() < deadline, "cluster did not come up"
            time.sleep(0.05)
        admin.close()
        yield server.url
    finally:
        server.stop()


@pytest.mark.slow
def test_limiter_works_on_a_cluster_client():
    # given a one-node cluster: any script touching keys of two slots would fail on it
    with one_node_cluster() as url:
        client = RedisCluster.from_url(url)
        limiter = Limiter(client, "on-cluster", LimiterConfig(rate=100, burst=2, max_concurrency=1))
        # expect: every operation works, including the wait for a freed lease
        first = limiter.acquire()
        limiter.release(first)
        assert limiter.state().in_flight == 0
        second = limiter.acquire()
        limiter.release(second)
        # the freed lease was taken at once (burst 2), not at the first's expiry; a count, not a
        # wall-clock gap, which a loaded machine stretches (74 ms seen on CI)
        assert second.requeued == 0 and second.slot_us - first.slot_us < first.lease_seconds * 1e5
        assert limiter.block(0.05).blocked_for > 0
        assert limiter.report_throttle(second).accepted
        held = limiter.acquire()
        assert limiter.state().in_flight == 1
        limiter.release(held)
        limiter.reset()
        client.close()
