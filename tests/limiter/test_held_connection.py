"""The scripts run on a connection the limiter keeps out of the client's pool (sync.py's
_HeldConnection); what redis-py's generic path did for them still happens: a flushed script is
loaded again, a dropped connection is made again or fails closed, a forked child opens its own,
and clients it cannot hold a connection of (a bounded pool, Sentinel's aside) keep the generic
path. Private Redis servers, so that flushing or killing touches no other test."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from devtools.devredis import RedisServer, free_port, server_binary, start_private_redis
from ratejobs.limiter import Limiter, LimiterConfig, LimiterUnavailable

FAST = LimiterConfig(rate=100_000, burst=10)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    server = start_private_redis()
    yield server
    server.stop()


def held_client_id(limiter: Limiter) -> int:
    """The Redis client id of the limiter's held connection (CLIENT ID sent on it)."""
    connection = limiter._held.connection
    connection.send_command("CLIENT", "ID")
    return int(connection.read_response())


def test_grants_run_on_one_held_connection_shared_by_limiters_of_a_client(server):
    client = redis.Redis.from_url(server.url)
    first, second = Limiter(client, "a", FAST), Limiter(client, "b", FAST)
    first.configure(FAST)
    second.configure(FAST)
    for _ in range(20):
        first.acquire()
        second.acquire()
    # expect: one connection for both limiters' scripts, kept out of the pool (not idle in it)
    assert first._held is second._held
    connection = first._held.connection
    assert connection is not None
    assert connection not in client.connection_pool._available_connections
    assert first.round_trips == second.round_trips == 21


def test_a_flushed_script_is_loaded_again(server):
    client = redis.Redis.from_url(server.url)
    limiter = Limiter(client, "flushed", FAST)
    limiter.acquire()
    # when Redis forgets every script (a restart, SCRIPT FLUSH, a failover to a fresh replica)
    client.script_flush()
    # expect: the next grant loads it and is granted; the one after runs on the held connection
    assert limiter.acquire().ready
    assert client.script_exists(limiter._scripts["acquire"].sha) == [True]
    id_before = held_client_id(limiter)
    assert limiter.acquire().ready
    assert held_client_id(limiter) == id_before


def test_a_killed_connection_is_made_again_and_the_grant_still_comes(server):
    client = redis.Redis.from_url(server.url)
    limiter = Limiter(client, "killed", FAST)
    limiter.acquire()
    killed = held_client_id(limiter)
    # when Redis drops the held connection (an idle timeout, a proxy restart)
    client.client_kill_filter(_id=killed)
    # expect: the grant comes all the same, and the held connection is a new one afterwards
    assert limiter.acquire().ready
    assert limiter.acquire().ready
    assert held_client_id(limiter) != killed


def test_redis_gone_after_the_connection_was_held_fails_closed(server):
    client = redis.Redis.from_url(
        server.url, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 1)
    )
    limiter = Limiter(client, "gone", FAST)
    limiter.acquire()
    server.stop()
    with pytest.raises(LimiterUnavailable, match="unreachable"):
        limiter.acquire()


def test_a_forked_child_uses_a_connection_of_its_own(server):
    client = redis.Redis.from_url(server.url)
    limiter = Limiter(client, "forked", FAST)
    limiter.acquire()
    parent_id = held_client_id(limiter)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grants on its own connection, then leaves at once
        try:
            granted = all(limiter.acquire().ready for _ in range(50))
            os.write(write, f"{int(granted)} {held_client_id(limiter)}".encode())
        finally:
            os._exit(0)
    # the parent keeps granting meanwhile, on its own connection
    assert all(limiter.acquire().ready for _ in range(50))
    os.waitpid(pid, 0)
    granted, child_id = os.read(read, 64).decode().split()
    assert granted == "1" and int(child_id) != parent_id
    assert held_client_id(limiter) == parent_id and limiter.acquire().ready


def test_a_bounded_pool_keeps_the_generic_path(server):
    pool = redis.BlockingConnectionPool.from_url(server.url, max_connections=1)
    limiter = Limiter(redis.Redis(connection_pool=pool), "bounded", FAST)
    # expect: no connection kept out of a pool whose users would wait for it
    assert limiter._held is None
    assert limiter.acquire().ready and limiter.state().configured


@pytest.fixture
def sentinel(server: RedisServer, tmp_path: Path) -> Iterator[Sentinel]:
    """A real Sentinel watching the private server as master "main"."""
    port = free_port()
    master_port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    config = tmp_path / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor main 127.0.0.1 {master_port} 1\n"
    )
    process = subprocess.Popen(
        [server_binary(), str(config), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sentinel = Sentinel([("127.0.0.1", port)], socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                sentinel.discover_master("main")
                break
            except (redis.ConnectionError, redis.sentinel.MasterNotFoundError):
                assert time.monotonic() < deadline, "sentinel did not come up"
                time.sleep(0.05)
        yield sentinel
    finally:
        process.terminate()
        process.wait(5)


def test_a_sentinel_managed_client_holds_a_sentinel_managed_connection(sentinel):
    limiter = Limiter(sentinel.master_for("main"), "watched", FAST)
    assert all(limiter.acquire().ready for _ in range(5))
    # expect: the held connection is Sentinel's own kind, which finds the master on connecting
    # and turns a demoted master's READONLY into a reconnection
    assert isinstance(limiter._held.connection, SentinelManagedConnection)
