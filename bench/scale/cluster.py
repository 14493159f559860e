"""A Redis Cluster of three masters (no replicas) on the services host, for the limiters; the
broker stays on the run's plain Redis, as docs/operations.md says (Celery's Redis transport
does not speak Cluster)."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

from bench.scale.hosts import start_redis
from devtools import devredis

MASTERS = 3
# Its default is 15 s; short, so a node's restart is noticed within the row.
NODE_TIMEOUT_MS = 5_000
# A node's cluster bus listens on its port + 10000: both must be free, and below 65536.
BUS_OFFSET = 10_000
PORTS = range(20_000, 40_000)
READY_TIMEOUT = 30.0


class ClusterError(RuntimeError):
    pass


class RedisClusterGroup:
    def __init__(self, address: str, root: Path) -> None:
        self.address, self.root = address, root
        root.mkdir()
        self.servers: list[devredis.RedisServer] = []
        self.ports: list[int] = []
        try:
            for number in range(MASTERS):
                port = _free_pair(address)
                self.servers.append(self._start_node(number, port))
                self.ports.append(port)
            self._create()
        except BaseException:
            self.stop()
            raise

    def _start_node(self, number: int, port: int) -> devredis.RedisServer:
        # Without full coverage required, the nodes go on serving their own slots while one of
        # them is down: by default every node refuses every key once a node is marked failed,
        # and one node's restart would stop every API (docs/operations.md, "Redis Cluster").
        return start_redis(
            self.address, self.root / f"node-{number}.log", port=port,
            extra=["--cluster-enabled", "yes", "--cluster-announce-ip", self.address,
                   "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                   "--cluster-require-full-coverage", "no"],
        )  # fmt: skip

    def _create(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ClusterError("no redis-cli to create the cluster with")
        nodes = [f"{self.address}:{port}" for port in self.ports]
        done = subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if done.returncode:
            raise ClusterError(f"redis-cli --cluster create: {done.stdout[-800:]}{done.stderr}")
        deadline = time.monotonic() + READY_TIMEOUT
        for port in self.ports:
            self._wait_ok(port, deadline)

    def _wait_ok(self, port: int, deadline: float) -> None:
        """Until the node on `port` says cluster_state ok (a monotonic `deadline`)."""
        client = redis.Redis(host=self.address, port=port, socket_timeout=5)
        try:
            while client.cluster("info").get("cluster_state") != "ok":
                if time.monotonic() > deadline:
                    raise ClusterError(f"node {port}: cluster_state not ok")
                time.sleep(0.1)
        finally:
            client.close()

    def environment(self) -> dict[str, str]:
        """REDIS_URL names one node (database 0: Cluster has no other)."""
        return {"REDIS_URL": f"redis://{self.address}:{self.ports[0]}/0", "REDIS_CLUSTER": "true"}

    def keys_by_node(self) -> list[int]:
        counts = []
        for port in self.ports:
            client = redis.Redis(host=self.address, port=port, socket_timeout=5)
            try:
                counts.append(client.dbsize())
            finally:
                client.close()
        return counts

    def node_of(self, name: str) -> int:
        """The port of the master serving the limiter `name` (its keys' hash tag, as
        ratejobs.limiter names them)."""
        slot = key_slot(name.encode())
        client = redis.Redis(host=self.address, port=self.ports[0], socket_timeout=5)
        try:
            for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        finally:
            client.close()
        raise ClusterError(f"no node serves slot {slot} of {name!r}")

    def restart(self, port: int, down_seconds: float) -> NodeRestart:
        """Kills the node on `port` (SIGKILL: its keys are gone, it keeps no copy) in a thread
        of its own and starts it again `down_seconds` later, with its nodes.conf (its identity
        and slots); returns at once."""
        restart = NodeRestart(port, down_seconds)
        restart.thread = threading.Thread(
            target=self._restart, args=(restart,), name="node-restart", daemon=True
        )
        restart.thread.start()
        return restart

    def _restart(self, restart: NodeRestart) -> None:
        number = self.ports.index(restart.port)
        server = self.servers[number]
        try:
            assert server.process is not None
            # not stop(): that removes the node's directory, and its nodes.conf with it
            server.process.kill()
            server.process.wait()
            restart.killed_at = time.time()
            time.sleep(restart.down_seconds)
            self.servers[number] = self._start_node(number, restart.port)
            restart.started_at = time.time()
            self._wait_ok(restart.port, time.monotonic() + READY_TIMEOUT)
            restart.ok_at = time.time()
        except Exception as exc:  # noqa: BLE001 (said in the row, not lost in a thread)
            restart.errors.append(f"node restart: {exc}")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@dataclass
class NodeRestart:
    """One node's restart, as `RedisClusterGroup.restart` ran it (epoch times, this host)."""

    port: int
    down_seconds: float
    killed_at: float | None = None
    started_at: float | None = None
    ok_at: float | None = None  # the node said cluster_state ok again
    errors: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                self.errors.append(f"the node's restart still running after {timeout:g} s")


def _free_pair(address: str) -> int:
    for _ in range(200):
        port = random.choice(PORTS)  # noqa: S311 (a port, not a secret)
        with contextlib.ExitStack() as stack:
            try:
                for candidate in (port, port + BUS_OFFSET):
                    probe = stack.enter_context(socket.socket())
                    probe.bind((address, candidate))
            except OSError:
                continue
            return port
    raise ClusterError("no free port pair for a cluster node")
