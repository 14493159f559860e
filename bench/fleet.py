"""The pace at a fast API against a real limiter, for fleets of several shapes; prints one
markdown table.

    python -m bench.fleet [--calls N] [--only 1x2,2x4,1x2cap,2x4cap]

The API is nginx's `limit_req` at 300 requests/s with a burst of 10 (`nodelay`: a request over
it is answered 429 at once), serving a small JSON file; ratejobs configures the API at 300/s,
burst 2. Each fleet (W worker processes of `celery -A project worker -c C`, with or without an
in-flight cap of 16) runs one job of N calls submitted through the REST API (gunicorn), and
the table gives, from nginx's access log: the calls it answered 200 and 429, the span from the
first arrival to the last, and the pace: the span the limit allows (N / 300 s) over the span
observed, so 1.0 is the limit exactly and less is quota left unused. Progress goes to stderr;
with BENCH_FLEET_TRACE=1 also the 200s per half second and the limiter's counters of each run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.jobs import Setup, Worker, bench_setup, limiter_round_trips
from bench.million import start_web
from devtools.devredis import free_port
from devtools.processes import stop_process_group

LIMIT_RATE = 300
LIMIT_BURST = 10
API_BURST = 2
CAP = 16
DEFAULT_CALLS = 3_000
FLEETS = {
    "1x2": (1, 2, 0),
    "2x4": (2, 4, 0),
    "1x2cap": (1, 2, CAP),
    "2x4cap": (2, 4, CAP),
}
NGINX_CONF = """
user root;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
    log_format arrivals '$msec $status';
    access_log {tmp}/access.log arrivals;
    limit_req_zone $server_name zone=api:1m rate={rate}r/s;
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 100000;
        location / {{
            limit_req zone=api burst={burst} nodelay;
            limit_req_status 429;
            default_type application/json;
            root {tmp}/www;
            try_files /ok.json =404;
        }}
    }}
}}
"""
JOB_TIMEOUT_SECONDS = 300.0
START_TIMEOUT_SECONDS = 30.0


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Row:
    fleet: str
    cap: int
    calls: int
    answered: int
    throttled: int
    span: float
    wall: float
    round_trips: int  # limiter scripts and capacity waits
    reservations: int  # the limiter's count of slots reserved ahead (spares, requeues too)

    @property
    def pace(self) -> float:
        return (self.answered / LIMIT_RATE) / self.span if self.span else 0.0


def wait_for_port(port: int, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"{what} did not start")
        time.sleep(0.1)


def start_nginx(tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        raise BenchError("nginx is not installed (Debian: apt-get install nginx-light)")
    (tmp / "www").mkdir()
    (tmp / "www" / "ok.json").write_text('{"ok": true}\n')
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, rate=LIMIT_RATE, burst=LIMIT_BURST))
    process = subprocess.Popen(
        [nginx, "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    wait_for_port(port, process, "nginx")
    return process, f"http://127.0.0.1:{port}", tmp / "access.log"


def arrivals(log: Path, since: int) -> list[tuple[float, int]]:
    with log.open("rb") as f:
        f.seek(since)
        lines = f.read().decode().split("\n")
    return [(float(t), int(status)) for t, status in (line.split() for line in lines if line)]


def run_fleet(
    setup: Setup, name: str, *, calls: int, api_url: str, web_url: str, token: str, log: Path
) -> Row:
    from ratejobs.services.apis import api_create

    processes, concurrency, cap = FLEETS[name]
    api = api_create(
        name=f"fleet-{name}-{uuid.uuid4().hex[:6]}", base_url=api_url, rate=LIMIT_RATE,
        burst=API_BURST, max_concurrency=cap,
    )  # fmt: skip
    _progress(f"{name}: {processes} x -c {concurrency}, cap {cap or 'none'}, {calls:,} calls")
    workers = []
    try:
        for i in range(processes):
            workers.append(Worker(setup.env, concurrency, setup.tmp / f"{name}-{i}.log"))
        since = log.stat().st_size if log.exists() else 0
        trips = limiter_round_trips(setup.redis)
        cpu_before = sum(worker.cpu_seconds() for worker in workers)
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        started = time.monotonic()
        body = {
            "api": api.name,
            "name": f"fleet {name}",
            "calls": [{"method": "GET", "path": f"/items/{i}"} for i in range(calls)],
        }
        response = session.post(f"{web_url}/api/jobs/", json=body, timeout=60)
        if response.status_code != 201:
            raise BenchError(f"job not created: {response.status_code} {response.text[:500]}")
        job_url = f"{web_url}/api/jobs/{response.json()['id']}/"
        while True:
            job = session.get(job_url, timeout=30).json()
            if job["status"] in ("completed", "cancelled"):
                break
            if time.monotonic() - started > JOB_TIMEOUT_SECONDS:
                raise BenchError(f"{name}: the job did not finish: {job}")
            time.sleep(0.2)
        wall = time.monotonic() - started
        trips = limiter_round_trips(setup.redis) - trips
        if os.environ.get("BENCH_FLEET_TRACE"):
            cpu = sum(worker.cpu_seconds() for worker in workers) - cpu_before
            _progress(
                f"{name}: worker CPU {cpu:.1f} s in the job's {wall:.1f} s, "
                f"{cpu / calls * 1000:.2f} ms per call (load {os.getloadavg()[0]:.2f})"
            )
    finally:
        for worker in workers:
            worker.stop()
    seen = arrivals(log, since)
    answered = [t for t, status in seen if status == 200]
    span = max(answered) - min(answered) if len(answered) > 1 else 0.0
    throttled = sum(1 for _, status in seen if status == 429)
    if answered and os.environ.get("BENCH_FLEET_TRACE"):
        first = min(answered)
        buckets = [0] * (int(span / 0.5) + 1)
        for t in answered:
            buckets[int((t - first) / 0.5)] += 1
        _progress(f"{name}: 200s per 0.5 s: {buckets}")
    from ratejobs.infra.limiters import api_limiter

    counts = api_limiter(api).state().counts
    reservations = counts.waits
    if os.environ.get("BENCH_FLEET_TRACE"):
        _progress(f"{name}: limiter counts {counts}")
    return Row(name, cap, calls, len(answered), throttled, span, wall, trips, reservations)


def render(rows: Sequence[Row], about: str) -> str:
    lines = [
        f"| fleet | in-flight cap | calls | 200s | 429s | span s | pace (limit {LIMIT_RATE}/s) "
        "| calls/s | job wall time s | limiter round trips / call | slots reserved ahead |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        processes, concurrency, _ = FLEETS[row.fleet]
        shape = f"{processes} worker{'s' if processes > 1 else ''}, `-c {concurrency}`"
        lines.append(
            f"| {shape} | {row.cap or 'none'} | {row.calls:,} | {row.answered:,} | "
            f"{row.throttled} | {row.span:.2f} | {row.pace:.3f} | "
            f"{row.answered / row.span if row.span else 0:.0f} | {row.wall:.1f} | "
            f"{row.round_trips / row.calls:.2f} | {row.reservations:,} |"
        )
    return "\n".join([*lines, "", about, ""])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__)
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS)
    parser.add_argument("--only", default=",".join(FLEETS), help="fleets, comma-separated")
    args = parser.parse_args(argv)
    names = [name for name in args.only.split(",") if name]
    unknown = set(names) - set(FLEETS)
    if unknown or args.calls < 1:
        parser.error(f"unknown fleets {sorted(unknown)}; choose from {list(FLEETS)}")
    rows = []
    with contextlib.ExitStack() as cleanup:
        setup = cleanup.enter_context(bench_setup())
        nginx, api_url, log = start_nginx(setup.tmp)
        cleanup.callback(nginx.terminate)
        web, web_url = start_web(setup.env, setup.tmp / "web.log")
        cleanup.callback(stop_process_group, web, 10)
        from rest_framework.authtoken.models import Token

        token = Token.objects.create(user=setup.owner).key
        for name in names:
            rows.append(
                run_fleet(setup, name, calls=args.calls, api_url=api_url, web_url=web_url,
                          token=token, log=log)
            )  # fmt: skip
        about = (
            f"nginx `limit_req` rate={LIMIT_RATE}r/s burst={LIMIT_BURST} nodelay (429 over it); "
            f"the API configured at {LIMIT_RATE}/s, burst {API_BURST}; jobs submitted with "
            "`POST /api/jobs/` to gunicorn (2 workers); " + setup.about
        )
    print(render(rows, about))
    return 0


def _progress(message: str) -> None:
    print(f"[bench.fleet] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
