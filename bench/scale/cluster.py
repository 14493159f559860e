"""A Redis Cluster of three masters (no replicas) on the services host, for the limiters; the
broker stays on the run's plain Redis, as docs/operations.md says (Celery's Redis transport
does not speak Cluster)."""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from bench.scale.hosts import start_redis
from devtools import devredis

MASTERS = 3
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
                self.servers.append(
                    start_redis(
                        address, root / f"node-{number}.log", port=port,
                        extra=["--cluster-enabled", "yes", "--cluster-announce-ip", address,
                                 "--cluster-node-timeout", "5000"],
                    )
                )  # fmt: skip
                self.ports.append(port)
            self._create()
        except BaseException:
            self.stop()
            raise

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
            client = redis.Redis(host=self.address, port=port, socket_timeout=5)
            try:
                while client.cluster("info").get("cluster_state") != "ok":
                    if time.monotonic() > deadline:
                        raise ClusterError(f"node {port}: cluster_state not ok")
                    time.sleep(0.2)
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

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


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
