"""A real gunicorn serving the project on the test database and Redis, for what Django's test
client cannot show: chunked bodies, the whole middleware and WSGI stack, and the peak memory of
the process that served a request (VmHWM of its worker, which the test process does not share).

It runs the development settings, DEBUG off as in production (with DEBUG on, Django keeps the
SQL of the last 9000 queries in memory, which a memory measurement would count) or on, to show
that no Django error page slips through. Tests using it need
`pytest.mark.django_db(transaction=True)`: the server sees only committed rows."""

from __future__ import annotations

import http.client
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from devtools.devredis import free_port
from devtools.processes import child_pids, stop_process_group
from tests.realparts import PROJECT_ROOT, database_url

# gunicorn imports Django and opens its first connections in a few seconds on a busy machine.
SERVER_START_TIMEOUT = 60.0
SERVER_STOP_TIMEOUT = 20.0
# A large upload takes tens of seconds; gunicorn's default 30 s would kill the worker.
WORKER_TIMEOUT_SECONDS = 600
MIB = 1024 * 1024


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log: Path

    def worker_pids(self) -> list[int]:
        return child_pids(self.process.pid)

    def peak_rss(self) -> int:
        """The highest resident memory (VmHWM) any worker has reached, in bytes."""
        return max(_vm_hwm(pid) for pid in self.worker_pids())

    def stop(self) -> None:
        stop_process_group(self.process, SERVER_STOP_TIMEOUT)


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


@pytest.fixture
def web_server(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start `gunicorn project.wsgi` on 127.0.0.1 and a free port, on the test database."""
    servers: list[Server] = []

    def start(workers: int = 1, debug: bool = False, **env_overrides: str) -> Server:
        port = free_port()
        log = tmp_path / f"gunicorn-{len(servers)}.log"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings.base",
            "DJANGO_DEBUG": "true" if debug else "false",
            "DATABASE_URL": database_url(),
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "RATEJOBS_CACHE_URL": redis_url,
            **env_overrides,
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "project.wsgi", "--bind", f"127.0.0.1:{port}",
             "--workers", str(workers), "--timeout", str(WORKER_TIMEOUT_SECONDS)],
            cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log.open("wb"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        server = Server(process, f"http://127.0.0.1:{port}", log)
        servers.append(server)
        _wait_until_serving(server, workers)
        return server

    yield start
    for server in servers:
        server.stop()


def _wait_until_serving(server: Server, workers: int) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            break
        try:
            # anonymous: 401 means the whole stack answered
            answered = requests.get(f"{server.url}/api/jobs/", timeout=5).status_code == 401
            if answered and len(server.worker_pids()) >= workers:
                return
        except requests.RequestException:  # refused, or a read timeout on a loaded machine
            pass
        time.sleep(0.2)
    raise RuntimeError(f"gunicorn did not start:\n{server.log.read_text(errors='replace')[-3000:]}")


@dataclass
class RawResponse:
    status: int
    content_type: str
    body: bytes
    sent: int  # bytes of the request body sent before the answer came


def post_raw(
    url: str, path: str, headers: dict[str, str], body: bytes, *, chunked: bool = False
) -> RawResponse:
    """POST `body` in 64 KiB pieces, with Content-Length or chunked, and stop sending as soon as
    the server answers: a server that refuses a body without reading it closes the connection,
    and a client that kept writing would get a reset instead of the answer."""
    host, port = url.removeprefix("http://").split(":")
    framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(len(body))}
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in {**headers, **framing}.items()
    )
    sent = 0
    with socket.create_connection((host, int(port)), timeout=WORKER_TIMEOUT_SECONDS) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n")
        for piece in _pieces(body, chunked):
            if select.select([sock], [], [], 0)[0]:
                break  # the answer is here
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return RawResponse(
            response.status, response.getheader("Content-Type", ""), response.read(), sent
        )


def _pieces(body: bytes, chunked: bool) -> Iterator[bytes]:
    size = 64 * 1024
    for start in range(0, len(body), size):
        piece = body[start : start + size]
        yield b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
    if chunked:
        yield b"0\r\n\r\n"
