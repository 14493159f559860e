"""What runs on each host of the scale run: PostgreSQL, Redis and the sandbox on the services
host (where this module runs), Celery workers and beat on the worker hosts, gunicorn on the web
host; each started by pid and stopped by its process group."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import requests

from bench.jobs import PROJECT_ROOT
from bench.scale.net import Host
from devtools import devredis
from devtools.processes import stop_process_group
from faults.chaos import PrivatePostgres

START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
WEB_PORT = 8000
WEB_WORKERS = 2
# Room for the worker processes of both hosts (a few connections each), beat, gunicorn and
# this run; PostgreSQL's default of 100 is enough today, the margin is for larger fleets.
PG_MAX_CONNECTIONS = 200


class HostError(RuntimeError):
    pass


class HostPostgres(PrivatePostgres):
    """faults.chaos' private cluster, listening on the services host's address instead of
    loopback, and accepting the other hosts of the network (trust, as the cluster is ours)."""

    def __init__(self, bindir: Path, root: Path, address: str, network: str) -> None:
        super().__init__(bindir, root)
        self.address = address
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {network} trust\n")

    @property
    def url(self) -> str:
        return f"postgres://postgres@{self.address}:{self.port}/postgres"

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses={self.address} -c fsync=off "
            f"-c max_connections={PG_MAX_CONNECTIONS}"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")  # fmt: skip


def start_redis(
    address: str, log: Path, *, port: int | None = None, extra: Sequence[str] = ()
) -> devredis.RedisServer:
    """A private redis-server on loopback (where devredis checks it answers) and `address`,
    with `extra` arguments."""
    return devredis.start_private_redis(
        port=port,
        logfile=log,
        # a second --bind replaces devredis' loopback-only one
        extra_args=["--bind", "127.0.0.1", address, "--protected-mode", "no", *extra],
    )


class HostProcess:
    """A command on a host (`ip netns exec`), in a process group of its own, logging to a
    file; started once `ready` is in its log (or `check` answers)."""

    def __init__(
        self, host: Host, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path,
        *, ready: str | None = None, check: str | None = None,
    ) -> None:  # fmt: skip
        self.host, self.name, self.log = host, name, log
        self._console = log.with_suffix(".console").open("ab")
        self.process = subprocess.Popen(
            [*host.exec_prefix(), *argv], cwd=PROJECT_ROOT, env=dict(env),
            stdin=subprocess.DEVNULL, stdout=self._console, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            self._wait(ready, check)
        except BaseException:
            self.stop()
            raise

    def _wait(self, ready: str | None, check: str | None) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        session = requests.Session()
        session.trust_env = False  # straight to the host, whatever proxy the environment names
        while True:
            if ready is not None and ready in self.text():
                return
            if check is not None:
                with contextlib.suppress(requests.RequestException):
                    if session.get(check, timeout=2).status_code == 200:
                        return
            if self.process.poll() is not None or time.monotonic() > deadline:
                console = self.log.with_suffix(".console").read_text(errors="replace")
                raise HostError(
                    f"{self.name} on {self.host.name} did not start:\n{self.text()[-2000:]}\n"
                    f"{console[-2000:]}"
                )
            time.sleep(0.2)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        stop_process_group(self.process, STOP_TIMEOUT)
        self._console.close()


def celery(host: Host, what: str, env: Mapping[str, str], tmp: Path) -> HostProcess:
    """`celery -A project worker` (-c 2) or `celery -A project beat` on `host`, as
    docs/operations.md says to run them on each machine."""
    log = tmp / f"{host.link}-{what}.log"
    if what == "worker":
        args = ["worker", "-c", "2", "-n", f"{host.link}@{host.name}"]
        ready = " ready."
    else:
        args = ["beat", "-s", str(tmp / "beat-schedule"), "--pidfile="]
        ready = "beat: Starting"
    argv = [sys.executable, "-m", "celery", "-A", "project", *args, "-l", "INFO", "-f", str(log)]
    return HostProcess(host, f"celery {what}", argv, env, log, ready=ready)


def web(host: Host, env: Mapping[str, str], tmp: Path) -> tuple[HostProcess, str]:
    """gunicorn serving project.wsgi on the host's address; returns it and its URL."""
    url = f"http://{host.address}:{WEB_PORT}"
    argv = [sys.executable, "-m", "gunicorn", "project.wsgi", "--bind",
            f"{host.address}:{WEB_PORT}", "--workers", str(WEB_WORKERS),
            "--error-logfile", str(tmp / "web.log")]  # fmt: skip
    process = HostProcess(host, "gunicorn", argv, env, tmp / "web.log", check=f"{url}/admin/login/")
    return process, url
