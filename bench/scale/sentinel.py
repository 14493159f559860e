"""Redis under Sentinel on the services host: one master, one replica and three sentinels on
ports of their own, the settings that point ratejobs at them, and a forced failover."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from pathlib import Path

import redis

from bench.scale.hosts import start_redis
from devtools import devredis

MASTER_NAME = "scale-master"
SENTINELS = 3
QUORUM = 2
# Short, so a failover of the run takes seconds; a real deployment keeps its defaults.
DOWN_AFTER_MS = 2_000
FAILOVER_TIMEOUT_MS = 10_000
# Sentinels find each other and the replica through the master's hello channel (every 2 s).
DISCOVERY_TIMEOUT = 30.0
SWITCH_TIMEOUT = 30.0
# What the promoted replica logs when the old master asks it for the writes it took after the
# promotion: it cannot, so the old master starts again from a full copy without them.
DISCARDED = re.compile(
    r"Partial resynchronization not accepted: Requested offset for second ID was (?P<asked>\d+), "
    r"but I can reply up to (?P<had>\d+)"
)
CONFIG = """port {port}
bind 127.0.0.1 {address}
protected-mode no
dir {directory}
logfile {directory}/sentinel.log
sentinel announce-ip {address}
sentinel monitor {name} {address} {master} {quorum}
sentinel down-after-milliseconds {name} {down_after}
sentinel failover-timeout {name} {failover_timeout}
sentinel parallel-syncs {name} 1
"""


class SentinelError(RuntimeError):
    pass


class SentinelRedis:
    """The group, started at once and stopped with `stop()`."""

    def __init__(self, address: str, root: Path) -> None:
        self.address, self.root = address, root
        self.demoted_after: float | None = None  # the old master's last failover, seconds
        root.mkdir()
        self.servers: list[devredis.RedisServer] = []
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.sentinel_ports: list[int] = []
        try:
            master = start_redis(address, root / "master.log")
            self.servers.append(master)
            self.master_port = _port(master.url)
            replica = devredis.start_private_redis(
                logfile=root / "replica.log",
                extra_args=["--bind", "127.0.0.1", address, "--protected-mode", "no",
                            "--replicaof", address, str(self.master_port),
                            "--replica-announce-ip", address],
            )  # fmt: skip
            self.servers.append(replica)
            for number in range(SENTINELS):
                self._start_sentinel(root / f"sentinel-{number}")
            self._wait_discovered()
        except BaseException:
            self.stop()
            raise

    def _start_sentinel(self, directory: Path) -> None:
        directory.mkdir()
        port = devredis.free_port()
        config = directory / "sentinel.conf"  # Sentinel rewrites it: a file of its own
        config.write_text(
            CONFIG.format(
                port=port, address=self.address, directory=directory, name=MASTER_NAME,
                master=self.master_port, quorum=QUORUM, down_after=DOWN_AFTER_MS,
                failover_timeout=FAILOVER_TIMEOUT_MS,
            )
        )  # fmt: skip
        self.sentinels.append(
            subprocess.Popen(
                [devredis.server_binary(), str(config), "--sentinel"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        )
        self.sentinel_ports.append(port)

    def _wait_discovered(self) -> None:
        """Until every sentinel knows the replica and the other sentinels: a failover needs
        the one, a quorum the others."""
        deadline = time.monotonic() + DISCOVERY_TIMEOUT
        for port in self.sentinel_ports:
            client = self._sentinel(port)
            try:
                while True:
                    with contextlib.suppress(redis.RedisError):
                        replicas = client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
                        others = client.execute_command("SENTINEL", "SENTINELS", MASTER_NAME)
                        if replicas and len(others) == SENTINELS - 1:
                            break
                    if time.monotonic() > deadline:
                        raise SentinelError(
                            f"sentinel on {port} did not find the replica and the other "
                            f"sentinels in {DISCOVERY_TIMEOUT:g} s"
                        )
                    time.sleep(0.2)
            finally:
                client.close()

    def environment(self, db: int) -> dict[str, str]:
        """What docs/operations.md ("Redis Sentinel") says to set, database `db`."""
        hosts = [f"{self.address}:{port}" for port in self.sentinel_ports]
        return {
            # only its database (and password) are read with Sentinels
            "REDIS_URL": f"redis://{self.address}:{self.master_port}/{db}",
            "REDIS_SENTINELS": ",".join(hosts),
            "REDIS_SENTINEL_MASTER": MASTER_NAME,
            "CELERY_BROKER_URL": ";".join(f"sentinel://{host}/{db}" for host in hosts),
        }

    def require_replicas(self, replicas: int, max_lag: int) -> None:
        """min-replicas-to-write on every server of the group (the master now, and the replica,
        a master after a failover): a master then refuses writes (NOREPLICAS) once fewer
        replicas than that have acknowledged within `max_lag` seconds."""
        for server in self.servers:
            if server.process is not None and server.process.poll() is None:
                client = redis.Redis(host="127.0.0.1", port=_port(server.url), socket_timeout=5)
                try:
                    client.config_set("min-replicas-to-write", replicas)
                    client.config_set("min-replicas-max-lag", max_lag)
                finally:
                    client.close()

    def master(self) -> tuple[str, int]:
        client = self._sentinel(self.sentinel_ports[0])
        try:
            host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        finally:
            client.close()
        return host.decode(), int(port)

    def failover(self, *, kill_old: bool) -> float:
        """SENTINEL FAILOVER, then until the sentinels name the replica as the master and it
        answers as one; returns the seconds that took. With `kill_old`, the old master is then
        killed (SIGKILL), as a master that failed for good: every client still connected to it
        loses its connection at once. Without it, a thread waits for the old master to become a
        replica (demoted_after): until then it still takes the clients' writes."""
        began = time.monotonic()
        before = self.master()
        self.demoted_after = None
        if not kill_old:
            threading.Thread(
                target=self._wait_demoted, args=(before[1], began), daemon=True
            ).start()
        client = self._sentinel(self.sentinel_ports[0])
        try:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        finally:
            client.close()
        deadline = began + SWITCH_TIMEOUT
        while True:
            with contextlib.suppress(redis.RedisError):
                now = self.master()
                if now != before and _role(now[1]) == "master":
                    break
            if time.monotonic() > deadline:
                raise SentinelError(f"no new master {SWITCH_TIMEOUT:g} s after SENTINEL FAILOVER")
            time.sleep(0.05)
        took = time.monotonic() - began
        if kill_old:
            old = next(s for s in self.servers if s.process and _port(s.url) == before[1])
            assert old.process is not None
            old.process.kill()
            old.process.wait()
        return took

    def _wait_demoted(self, port: int, began: float) -> None:
        deadline = began + SWITCH_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if _role(port) == "slave":
                    self.demoted_after = time.monotonic() - began
                    return
            time.sleep(0.05)

    def discarded_bytes(self) -> int | None:
        """Of the old master's replication stream, the bytes the new master never had and the
        old one dropped when it resynchronized from it (its servers' logs say)."""
        for log in self.root.glob("*.log"):
            found = DISCARDED.search(log.read_text(errors="replace"))
            if found:
                return int(found["asked"]) - int(found["had"])
        return None

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def stop(self) -> None:
        for process in self.sentinels:
            process.terminate()
        for process in self.sentinels:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for server in self.servers:
            server.stop()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _role(port: int) -> str:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        return client.info("replication")["role"]
    finally:
        client.close()
