"""Slow clients against the web server as docker-compose.yml deploys it: a real nginx running
deploy/nginx.conf in front of gunicorn started with compose's `web` command. Ten clients that
trickle their headers or read a results download slowly hold nginx's connections, not
gunicorn's threads, so /healthz keeps answering within a second; against gunicorn alone (what
a deployment without the proxy exposes) a few more such clients than its threads stall it.

nginx is not on a fresh machine: these tests skip without it (with CI=true a skip fails; .ci/run
installs Debian's nginx-light)."""

from __future__ import annotations

import contextlib
import grp
import http.client
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from rest_framework.authtoken.models import Token

from devtools.devredis import free_port
from devtools.processes import child_pids, stop_process_group
from ratejobs.login_throttle import client_address
from ratejobs.models import Call, Job
from tests.realparts import PROJECT_ROOT, database_url
from tests.rest.realserver import MIB
from tests.test_compose import command_of, env_example, interpolate

NGINX_CONF = PROJECT_ROOT / "deploy" / "nginx.conf"
START_TIMEOUT = 60.0  # gunicorn imports Django and opens its first connections
STOP_TIMEOUT = 20.0
# What the issue asks of /healthz while slow clients are connected.
ANSWER_WITHIN = 1.0
PROBE_SECONDS = 4.0
PROBE_GAP = 0.2
# A results file of about 9.4 MiB, more than loopback's sockets hold between a server and a
# slow reader (a 4 MiB send buffer at most, and the reader's small receive buffer), so a
# server passing it at the reader's pace waits on the reader.
CALLS = 600
BODY = b'{"pad": "' + b"x" * 16_000 + b'"}'
# The ten slow clients: a header line a second and never the blank line that ends the head,
# or a download read a piece a second through a small receive buffer.
HEADER_TRICKLERS = 5
SLOW_READERS = 5
TRICKLE_INTERVAL = 1.0
READ_PIECE = 1024
READER_RECEIVE_BUFFER = 4096
# Time for gunicorn to hand every slow client to a thread (it does as their first bytes come).
SETTLE_SECONDS = 0.5


# -- the servers ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    found = shutil.which("nginx")
    if found is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light; .ci/run does)")
    return found


@dataclass
class Gunicorn:
    process: subprocess.Popen
    port: int
    workers: int
    threads: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def compose_web_command() -> list[str]:
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    return command_of(compose["services"]["web"])


@pytest.fixture(scope="module")
def compose_web(
    django_db_setup: None, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gunicorn]:
    """gunicorn as compose's `web` service runs it, bound to 127.0.0.1 and a free port instead
    of 0.0.0.0:8000, on the test database and Redis."""
    argv = compose_web_command()
    assert argv[:2] == ["gunicorn", "project.wsgi"], argv
    options = dict(zip(argv[2::2], argv[3::2], strict=True))  # every option takes a value
    port = free_port()
    argv[argv.index("--bind") + 1] = f"127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("gunicorn") / "gunicorn.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings.base",
        "DJANGO_DEBUG": "false",
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "RATEJOBS_CACHE_URL": redis_url,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", *argv], cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL,
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    server = Gunicorn(
        process, port, int(options["--workers"]), int(options.get("--threads", "1")), log
    )
    try:
        _wait_until(
            lambda: _answers(f"{server.url}/healthz")
            and len(child_pids(process.pid)) >= server.workers,
            process, log, "gunicorn",
        )  # fmt: skip
        yield server
    finally:
        stop_process_group(process, STOP_TIMEOUT)


def nginx_test_config(upstream_port: int, listen_port: int, home: Path, nginx_binary: str) -> str:
    """deploy/nginx.conf with the test's upstream, port, and files in `home`, run as this user.
    Each line replaced must be there once: a config the rewrite no longer fits fails here
    rather than testing something else."""
    text = NGINX_CONF.read_text()

    def replace(pattern: str, new: str) -> None:
        nonlocal text
        text, count = re.subn(pattern, lambda _: new, text, flags=re.MULTILINE)
        assert count == 1, f"deploy/nginx.conf: {pattern!r} matched {count} times"

    # the user directive means something to a master process running as root only
    user = pwd.getpwuid(os.geteuid()).pw_name
    group = grp.getgrgid(os.getegid()).gr_name
    replace(r"^user \S+;$", f"user {user} {group};" if os.geteuid() == 0 else "")
    replace(r"^pid \S+;$", f"pid {home}/nginx.pid;")
    replace(r"^error_log \S+", f"error_log {home}/error.log")
    replace(r"access_log \S+;", f"access_log {home}/access.log;")
    replace(r"client_body_temp_path \S+;", f"client_body_temp_path {home}/client_temp;")
    replace(r"proxy_temp_path \S+;", f"proxy_temp_path {home}/proxy_temp;")
    replace(r"listen 8000;", f"listen 127.0.0.1:{listen_port};")
    replace(r"http://web:8000;", f"http://127.0.0.1:{upstream_port};")
    # the other modules' temporary directories, which this build creates at start
    built = subprocess.run([nginx_binary, "-V"], capture_output=True, text=True).stderr
    others = "".join(
        f"    {module}_temp_path {home}/{module}_temp;\n"
        for module in ("fastcgi", "uwsgi", "scgi")
        if f"--without-http_{module}_module" not in built
    )
    replace(r"^http \{\n", "http {\n" + others)
    return text


@pytest.fixture
def start_nginx(nginx_binary: str, tmp_path: Path) -> Iterator[Callable[[int], str]]:
    """Start nginx with deploy/nginx.conf in front of 127.0.0.1:<upstream port>; its URL."""
    processes: list[subprocess.Popen] = []

    def start(upstream_port: int) -> str:
        home = tmp_path / f"nginx-{len(processes)}"
        home.mkdir()
        port = free_port()
        conf = home / "nginx.conf"
        conf.write_text(nginx_test_config(upstream_port, port, home, nginx_binary))
        log = home / "error.log"
        process = subprocess.Popen(
            [nginx_binary, "-p", str(home), "-c", str(conf), "-e", str(log), "-g", "daemon off;"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        processes.append(process)
        _wait_until(lambda: _accepts(port), process, log, "nginx")
        return f"http://127.0.0.1:{port}"

    yield start
    for process in processes:
        stop_process_group(process, STOP_TIMEOUT)


def _wait_until(ready: Callable[[], bool], process: subprocess.Popen, log: Path, name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not start:\n{log.read_text(errors='replace')[-3000:]}")


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# -- the slow clients and the probe -----------------------------------------------------------


@dataclass
class SlowClient:
    sock: socket.socket
    reads: bool  # a download read slowly; else a head sent a line at a time
    received: bytearray = field(default_factory=bytearray)
    lines_sent: int = 0
    dropped: bool = False  # the server closed or reset it


@contextlib.contextmanager
def slow_clients(
    url: str, *, tricklers: int = 0, readers: int = 0, download: str = "", token: str = ""
) -> Iterator[list[SlowClient]]:
    """`tricklers` connections that send a header line every TRICKLE_INTERVAL and never end
    their head, and `readers` GETs of `download` that read READ_PIECE every TRICKLE_INTERVAL
    through a READER_RECEIVE_BUFFER socket buffer; one thread drives them all."""
    host, port = url.removeprefix("http://").split(":")
    clients: list[SlowClient] = []
    stop = threading.Event()
    driver = threading.Thread(target=_drive, args=(clients, stop), daemon=True)
    try:
        for _ in range(tricklers):
            sock = socket.create_connection((host, int(port)), timeout=5)
            clients.append(SlowClient(sock, reads=False))
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        for _ in range(readers):
            sock = socket.socket()
            clients.append(SlowClient(sock, reads=True))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READER_RECEIVE_BUFFER)
            sock.settimeout(5)
            sock.connect((host, int(port)))
            sock.sendall(
                f"GET {download} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Authorization: Token {token}\r\nConnection: close\r\n\r\n".encode()
            )
        for client in clients:
            # the driver never waits on one client (on a socket with a timeout it would)
            client.sock.setblocking(False)
        driver.start()
        yield clients
    finally:
        stop.set()
        if driver.is_alive():
            driver.join()
        for client in clients:
            client.sock.close()


def _drive(clients: list[SlowClient], stop: threading.Event) -> None:
    while not stop.wait(TRICKLE_INTERVAL):
        for client in clients:
            if client.dropped:
                continue
            try:
                if client.reads:
                    piece = client.sock.recv(READ_PIECE)
                    client.received += piece
                    client.dropped = not piece
                else:
                    client.sock.send(f"X-Slow-{client.lines_sent}: {'x' * 32}\r\n".encode())
                    client.lines_sent += 1
            except BlockingIOError:
                pass  # nothing to read yet
            except OSError:
                client.dropped = True


def probe_healthz(url: str, seconds: float, *, until_stalled: bool = False) -> list[float | None]:
    """GET /healthz on a new connection every PROBE_GAP for `seconds` (or until one stalls):
    each one's time to its 200, or None when it had none within ANSWER_WITHIN."""
    latencies: list[float | None] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (until_stalled and None in latencies):
        began = time.monotonic()
        try:
            response = requests.get(f"{url}/healthz", timeout=ANSWER_WITHIN)
        except requests.Timeout:
            latencies.append(None)
            continue
        elapsed = time.monotonic() - began
        assert response.status_code == 200, response.text[:500]
        latencies.append(elapsed if elapsed < ANSWER_WITHIN else None)
        time.sleep(PROBE_GAP)
    return latencies


def summary(latencies: list[float | None]) -> str:
    answered = [latency for latency in latencies if latency is not None]
    slowest = f", slowest {max(answered) * 1000:.0f} ms" if answered else ""
    return f"{len(answered)} of {len(latencies)} probes answered within {ANSWER_WITHIN} s{slowest}"


# -- the tests --------------------------------------------------------------------------------


@pytest.fixture
def large_job(make_job: Callable[..., Job]) -> Job:
    """A job of CALLS succeeded calls with BODY each: a results.jsonl of several MiB."""
    job = make_job(calls=CALLS)
    Call.objects.filter(job=job).update(status="succeeded", attempts=1, response_body=BODY)
    return job


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_ten_slow_clients_leave_healthz_answering_through_nginx(
    compose_web, start_nginx, large_job, user
):
    # given: nginx with deploy/nginx.conf in front of gunicorn as compose runs it
    nginx = start_nginx(compose_web.port)
    token = Token.objects.create(user=user).key
    download = f"/api/jobs/{large_job.pk}/results.jsonl"
    served_before = compose_web.log.read_text().count(download)
    # when: five clients read the results at a trickle, and once nginx has each whole file from
    # gunicorn (which logs a request when it has sent it), five more trickle a header line a
    # second
    with slow_clients(nginx, readers=SLOW_READERS, download=download, token=token) as readers:
        deadline = time.monotonic() + START_TIMEOUT
        while compose_web.log.read_text().count(download) - served_before < SLOW_READERS:
            assert time.monotonic() < deadline, "gunicorn is still sending the downloads"
            time.sleep(0.1)
        with slow_clients(nginx, tricklers=HEADER_TRICKLERS) as tricklers:
            latencies = probe_healthz(nginx, PROBE_SECONDS)
    print(f"\nthrough nginx, {len(readers + tricklers)} slow clients: {summary(latencies)}")
    # expect: every probe answered within a second, while the slow clients were there all along
    # (each trickler sent its lines, each reader has the start of its file)
    assert latencies and None not in latencies, summary(latencies)
    assert not [client for client in readers + tricklers if client.dropped]
    for reader in readers:
        assert reader.received.startswith(b"HTTP/1.1 200 OK\r\n"), reader.received[:200]
        assert len(reader.received) < MIB < len(BODY) * CALLS
    assert all(t.lines_sent >= PROBE_SECONDS / TRICKLE_INTERVAL - 1 for t in tricklers)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_same_slow_clients_and_a_few_more_stall_gunicorn_alone(compose_web, large_job, user):
    # What this shows: why nginx is in front (compose published gunicorn's port before). gthread
    # hands a connection to a thread when its first bytes come, and the thread then waits on
    # the client; a worker accepts connections whether its threads are free or not, so a probe
    # landing on a worker whose threads all wait queues behind them. One more slow client than
    # the server has threads fills at least one worker; which worker takes a probe is the
    # kernel's choice, hence several probes.
    token = Token.objects.create(user=user).key
    download = f"/api/jobs/{large_job.pk}/results.jsonl"
    threads = compose_web.workers * compose_web.threads
    with slow_clients(
        compose_web.url, tricklers=threads + 1 - SLOW_READERS, readers=SLOW_READERS,
        download=download, token=token,
    ) as clients:  # fmt: skip
        time.sleep(SETTLE_SECONDS)
        latencies = probe_healthz(compose_web.url, PROBE_SECONDS, until_stalled=True)
        print(f"\ngunicorn alone, {len(clients)} slow clients against {threads} threads:"
              f" {summary(latencies)}")  # fmt: skip
    assert None in latencies, summary(latencies)


# -- what the proxy passes on -----------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.seen.append({name.lower(): value for name, value in self.headers.items()})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recording_upstream() -> Iterator[tuple[int, list[dict[str, str]]]]:
    """An upstream that answers 200 and keeps each request's headers."""
    handler = type("Recorder", (_Recorder,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler.seen
    server.shutdown()
    server.server_close()


def raw_request(url: str, head: str) -> tuple[int, str, bytes]:
    """Send `head` as it is; the answer's status, Content-Type and body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode("latin-1"))
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.getheader("Content-Type", ""), response.read()


def test_nginx_passes_the_client_host_and_address_and_only_https_as_a_scheme(
    start_nginx, recording_upstream
):
    upstream_port, seen = recording_upstream
    nginx = start_nginx(upstream_port)
    # a client's own X-Forwarded-For (forged, or a TLS proxy's) is kept, and nginx appends the
    # address it saw: with RATEJOBS_TRUSTED_PROXY_COUNT=1 the sign-in throttle counts that one
    for proto in ("https", "http", "gopher", None):
        head = (
            "GET /healthz HTTP/1.1\r\nHost: ratejobs.example:8443\r\nConnection: close\r\n"
            "X-Forwarded-For: 203.0.113.7\r\n"
            + (f"X-Forwarded-Proto: {proto}\r\n" if proto else "")
            + "\r\n"
        )
        assert raw_request(nginx, head)[0] == 200
    protos = [headers.get("x-forwarded-proto") for headers in seen]
    assert protos == ["https", "http", "http", "http"]
    for headers in seen:
        assert headers["host"] == "ratejobs.example:8443"
        assert headers["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"
        meta = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": headers["x-forwarded-for"]}
        assert client_address(meta, trusted_proxies=1) == "127.0.0.1"


def test_nginx_refuses_a_body_over_the_upload_cap_in_the_apis_words(
    start_nginx, recording_upstream, settings
):
    # given a declared length one byte over RATEJOBS_MAX_UPLOAD_BYTES, expect the REST API's
    # 413 (JSON, naming the limit) before any of the body is sent or reaches the app
    upstream_port, seen = recording_upstream
    nginx = start_nginx(upstream_port)
    cap = settings.RATEJOBS_MAX_UPLOAD_BYTES
    status, content_type, body = raw_request(
        nginx, f"POST /api/jobs/upload/ HTTP/1.1\r\nHost: localhost\r\nContent-Length: {cap + 1}"
        "\r\nContent-Type: application/x-ndjson\r\n\r\n",
    )  # fmt: skip
    assert (status, content_type) == (413, "application/json")
    assert json.loads(body) == {
        "detail": f"Request body too large: the limit is {cap} bytes (RATEJOBS_MAX_UPLOAD_BYTES)."
    }
    assert seen == []


def test_compose_reaches_the_web_server_only_through_nginx():
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    web, nginx = services["web"], services["nginx"]
    assert "ports" not in web
    assert nginx["ports"] == ["${WEB_PORT:-8000}:8000"]
    assert nginx["volumes"] == ["./deploy/nginx.conf:/etc/nginx/nginx.conf:ro"]
    assert re.fullmatch(r"nginx:\d+\.\d+(\.\d+)?(-\w+)?", nginx["image"]), "pin nginx's version"
    assert nginx["restart"] == "unless-stopped"
    assert "http://web:8000;" in NGINX_CONF.read_text()
    assert "--bind" in command_of(web) and "0.0.0.0:8000" in command_of(web)
    # the web server trusts exactly the one proxy, with .env.example as it ships
    trusted = interpolate(str(web["environment"]["RATEJOBS_TRUSTED_PROXY_COUNT"]), env_example())
    assert trusted == "1"
    assert web["environment"]["DJANGO_SETTINGS_MODULE"] == "project.settings.production"
