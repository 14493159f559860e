"""The scale run's two halves: outside, the topology (namespaces, bridge, veths) around the
run; inside it, on the services host, the services, then for each row the web host and the
worker hosts with the row's clocks and Redis, one job through the REST API, and the"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from bench.jobs import BENCH_REDIS_DB, BenchError
from bench.scale import measure, net
from bench.scale.cluster import ClusterError, NodeRestart, RedisClusterGroup
from bench.scale.cutoff import CUT_SECONDS, REJOIN_TIMEOUT, CutOff
from bench.scale.hosts import HostError, HostPostgres, HostProcess, celery, start_redis, web
from bench.scale.net import SERVICES, WEB, WORKER_1, WORKER_2, Host
from bench.scale.pgbouncer import PgBouncer, PgBouncerError
from bench.scale.rows import (
    API_BURST,
    FAULT_AT,
    LIMIT,
    MIN_REPLICAS_MAX_LAG,
    NODE_DOWN_SECONDS,
    SANDBOX_BURST,
    SCENARIOS,
    THROTTLE_SECONDS,
    THROTTLE_SHARE,
    Row,
    Scenario,
    render,
)
from bench.scale.sentinel import SentinelError, SentinelRedis
from devtools import wallclock as clock
from faults.chaos import CHAOS_SETTINGS, IDEMPOTENCY_HEADER, ChaosError, recovery_seconds

DEFAULT_CALLS = 2_000
POLL_SECONDS = 0.25
# Connections are counted every this many polls (once a second).
PEAK_EVERY = 4
# A job's time at the limit, twice over, and this more for starting and a stalled dispatch.
JOB_SLACK_SECONDS = 90.0
# After the job, requests of a worker presumed dead (none expected) would still arrive.
SETTLE_SECONDS = 1.0
# After a failover, one call submitted through the web host must be done within this.
PROBE_TIMEOUT = 60.0
# In cluster-node-restart, requests granted before the node died may still arrive this long
# after (a worker waits up to RATEJOBS_MAX_WORKER_WAIT, 1 s, for its slot), and the other API
# keeps at least this share of its rate while the node is down.
GRANTED_BEFORE_SECONDS = 1.5
OTHER_PACE_FLOOR = 0.9
# The second API's calls' paths: /items/other-{i}.
OTHER_PREFIX = "other-"
OTHER_PATHS = f"/items/{OTHER_PREFIX}"
# Set (to anything): the logs are kept in FAILED_LOGS whatever the result.
KEEP_LOGS = "BENCH_SCALE_KEEP_LOGS"
FAILED_LOGS = Path(__file__).resolve().parents[2] / "artifacts" / "scale"


class ScaleError(RuntimeError):
    pass


@dataclass
class Rig:
    tmp: Path
    env: dict[str, str]  # for the processes on the worker and web hosts
    sandbox: Any  # sandbox.process.SandboxProcess
    session: requests.Session  # with the token of the jobs' owner
    wallclock: Path | None  # the preload library; None without a C compiler
    cleanup: contextlib.ExitStack
    postgres: HostPostgres
    sentinel: SentinelRedis | None = None  # started for the first row that needs it
    cluster: RedisClusterGroup | None = None  # likewise
    pgbouncer: PgBouncer | None = None  # likewise

    def redis_env(self, kind: str) -> dict[str, str]:
        if kind == "plain":
            return {}
        if kind == "cluster":
            if self.cluster is None:
                self.cluster = RedisClusterGroup(SERVICES.address, self.tmp / "cluster")
                self.cleanup.callback(self.cluster.stop)
            # The broker on the run's plain Redis (bench.jobs' database), and the web's cache
            # too: Django's RedisCache does not speak Cluster (left to default, it names a
            # node of the cluster, and every throttle counting in it fails; docs/scaling.md).
            plain = self.env["REDIS_URL"]
            return {
                **self.cluster.environment(),
                "CELERY_BROKER_URL": plain,
                "RATEJOBS_CACHE_URL": plain,
            }
        if self.sentinel is None:
            groups = len(list(self.tmp.glob("sentinel*")))  # one a Sentinel fault row
            self.sentinel = SentinelRedis(SERVICES.address, self.tmp / f"sentinel{groups or ''}")
            self.cleanup.callback(self.sentinel.stop)
        return self.sentinel.environment(BENCH_REDIS_DB)

    def sentinel_settings(self, scenario: Scenario) -> None:
        """The row's min-replicas-to-write on the group's servers (0, Redis's default, unless
        the row says otherwise)."""
        if self.sentinel is not None and scenario.redis == "sentinel":
            self.sentinel.require_replicas(scenario.min_replicas, MIN_REPLICAS_MAX_LAG)

    def database_env(self, kind: str) -> dict[str, str]:
        if kind == "direct":
            return {}
        if self.pgbouncer is None:
            root = Path(tempfile.mkdtemp(prefix="ratejobs-scale-pgbouncer-"))
            self.cleanup.callback(shutil.rmtree, root, ignore_errors=True)
            self.pgbouncer = PgBouncer(SERVICES.address, SERVICES.address, self.postgres.port, root)
            self.cleanup.callback(self.pgbouncer.stop)
        url = self.pgbouncer.url(self.env["DATABASE_URL"])
        _progress(f"{self.pgbouncer.version()}: {url}")
        return {"DATABASE_URL": url}


# -- outside: the topology ------------------------------------------------------------------------


def outside(argv: Sequence[str]) -> int:
    with net.topology():
        _progress(
            "hosts: "
            + "; ".join(f"{h.name} {h.address} ({h.role})" for h in net.HOSTS)
            + f"; bridge {net.BRIDGE} in {net.NET}"
        )
        child = subprocess.Popen(
            [*SERVICES.exec_prefix(), sys.executable, "-m", "bench.scale", "--inside", *argv],
            cwd=Path(__file__).resolve().parents[2],
        )
        try:
            return child.wait()
        except BaseException:  # Ctrl-C reached the child too; SIGTERM did not
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(60)
            raise


# -- inside, on the services host -----------------------------------------------------------------


def inside(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    began = time.monotonic()
    rows: list[Row] = []
    with contextlib.ExitStack() as cleanup:
        tmp = Path(tempfile.mkdtemp(prefix="ratejobs-scale-"))
        cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        cleanup.callback(_keep_logs_if_failed, rows, tmp)
        rig, about = _start(tmp, cleanup)
        for name in args.scenarios:
            row = run_row(rig, SCENARIOS[name], args.calls)
            rows.append(row)
            _progress(f"{name}: {row.result}" + "".join(f"; {p}" for p in row.problems))
    command = f"python -m bench.scale --calls {args.calls} --only {','.join(args.scenarios)}"
    about = f"Command: `{command}`; {date_now()}; total {time.monotonic() - began:.0f} s. " + about
    print(render(rows, about))
    failed = sum(row.result != "pass" for row in rows)
    print(f"scale: {len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _start(tmp: Path, cleanup: contextlib.ExitStack) -> tuple[Rig, str]:
    """PostgreSQL, Redis and the sandbox on this host; Django set up in this process."""
    from faults.chaos import postgres_bindir

    bindir = postgres_bindir()
    if bindir is None:
        raise ScaleError("no PostgreSQL binaries (initdb, pg_ctl): the hosts need a server")
    pg_root = Path(tempfile.mkdtemp(prefix="ratejobs-scale-pg-"))
    cleanup.callback(shutil.rmtree, pg_root, ignore_errors=True)
    postgres = HostPostgres(bindir, pg_root, SERVICES.address, net.NETWORK)
    postgres.start()
    cleanup.callback(postgres.stop)
    redis_server = start_redis(SERVICES.address, tmp / "redis.log")
    cleanup.callback(redis_server.stop)
    redis_port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
    os.environ.update(
        DATABASE_URL=postgres.url,
        REDIS_URL=f"redis://{SERVICES.address}:{redis_port}/0",
        # the sandbox's address, which the outbound policy refuses by default (private)
        RATEJOBS_OUTBOUND_ALLOW=f"{SERVICES.address}/32",
        DJANGO_ALLOWED_HOSTS=WEB.address,
    )
    os.environ.pop("CELERY_BROKER_URL", None)
    _progress(f"PostgreSQL at {postgres.url}, Redis at {os.environ['REDIS_URL']}")

    from bench.jobs import bench_setup

    setup = cleanup.enter_context(bench_setup())
    from rest_framework.authtoken.models import Token

    from sandbox.process import start_sandbox_process

    sandbox = start_sandbox_process(
        host=SERVICES.address, rate=LIMIT, burst=SANDBOX_BURST, headers="none"
    )
    cleanup.callback(sandbox.stop)
    session = requests.Session()
    session.trust_env = False  # straight to the web host, whatever proxy the environment names
    session.headers["Authorization"] = f"Token {Token.objects.create(user=setup.owner).key}"
    try:
        library: Path | None = clock.build(tmp)
    except clock.ClockError as exc:
        _progress(f"{exc}: rows with skewed clocks fail")
        library = None
    _progress(f"sandbox at {sandbox.url} ({LIMIT:g}/s, burst {SANDBOX_BURST})")
    rig = Rig(tmp, setup.env, sandbox, session, library, cleanup, postgres)
    about = (
        f"Sandbox enforcing {LIMIT:g}/s (burst {SANDBOX_BURST}) on {SERVICES.address}; the API "
        f"at {LIMIT:g}/s (burst {API_BURST}); hosts as network namespaces on one bridge: "
        f"services {SERVICES.address} (PostgreSQL, Redis, sandbox), workers "
        f"{WORKER_1.address} (`celery -A project worker -c 2` and beat) and {WORKER_2.address} "
        f"(`celery -A project worker -c 2`), web {WEB.address} (gunicorn, 2 workers), all "
        "started again for each row; jobs submitted with `POST /api/jobs/`; skewed wall clocks "
        "by devtools/wallclock.c (LD_PRELOAD; monotonic clocks untouched). " + setup.about
    )
    return rig, about


def run_row(rig: Rig, scenario: Scenario, calls: int) -> Row:
    calls = scenario.calls or calls
    row = Row(scenario, calls)
    _progress(f"{scenario.name}: {scenario.topology}; {scenario.what}")
    other: int | None = None  # cluster-node-restart's second API's job
    with contextlib.ExitStack() as stop:
        processes, web_url = _start_hosts(rig, scenario, stop, row)
        if row.problems:
            return row
        rig.sentinel_settings(scenario)
        if scenario.fault == "node-restart":
            api, other_api = _apis_on_two_nodes(rig, scenario)
        else:
            api, other_api = _api(rig, scenario, LIMIT), None
        rig.sandbox.reset()
        cut: CutOff | None = None
        restart: list[NodeRestart] = []
        fault: Callable[[], None] | None = None
        if scenario.fault in ("failover", "switchover"):
            fault = _failover(rig, row, kill_old=scenario.fault == "failover")
        elif scenario.fault == "cut-off":
            worker = next(p for p in processes if p.host == WORKER_2 and "worker" in p.name)
            cut = CutOff(WORKER_2, worker.process.pid)
            fault = cut.strike
        elif scenario.fault == "node-restart":
            assert rig.cluster is not None
            cluster, port = rig.cluster, rig.cluster.node_of(api.name)
            row.notes.append(
                f"{api.name}'s limiter on node {port}, {other_api.name}'s on node "
                f"{cluster.node_of(other_api.name)}"
            )
            fault = lambda: restart.append(cluster.restart(port, NODE_DOWN_SECONDS))  # noqa: E731
        elif scenario.fault == "pgbouncer-restart":
            fault = _restart_pgbouncer(rig, row)
        elif scenario.fault == "throttle":
            fault = _throttle(rig, row, stop)
        counters = _redis_counters(rig, scenario)
        before = {what: measure.redis_snapshot(clients) for what, clients in counters.items()}
        if other_api is not None:
            other = _submit(rig, web_url, row, other_api.name, calls, OTHER_PREFIX)
        run = _run_job(rig, web_url, row, api.name, calls, fault)
        for what, clients in counters.items():
            measure.redis_per_call(row, what, before[what], measure.redis_snapshot(clients))
            for client in clients:
                client.close()
        if other is not None:
            _wait_other(rig, web_url, row, other)
        clients = ", ".join(measure.database_clients())
        row.notes.append(f"connections to PostgreSQL by address at the job's end: {clients}")
        if cut is not None:
            cut.join(CUT_SECONDS + REJOIN_TIMEOUT)
            _rejoined(cut, row)
        for node in restart:
            node.join(NODE_DOWN_SECONDS + 60)
            row.problems += node.errors
        time.sleep(SETTLE_SECONDS)
        stats = rig.sandbox.stats(detail=True)
        if run.struck is not None and row.job_seconds is not None:
            row.recover = recovery_seconds(run.samples, run.struck)
        if run.struck_at is not None and scenario.fault is not None:
            measure.after_fault(row, stats, run.struck_at, apis=2 if other else 1)
        for node in restart:
            _node_down(row, stats, node)
        if scenario.fault is not None:
            _probe(rig, web_url, row, api.name)
        if scenario.database == "pgbouncer":
            _export(rig, web_url, row, run.job_id)
        if scenario.redis == "cluster" and rig.cluster is not None:
            keys = rig.cluster.keys_by_node()
            row.notes.append(f"keys on the cluster's masters: {', '.join(map(str, keys))}")
        if scenario.fault == "switchover" and rig.sentinel is not None:
            _split_brain(rig.sentinel, row)
    if scenario.fault in ("failover", "switchover") and rig.sentinel is not None:
        # a later Sentinel row starts a group of its own: this one's old master is dead, or
        # its logs hold this row's resynchronisation
        rig.sentinel.stop()
        rig.sentinel = None
    # the workers are stopped: their logs are whole
    measure.cache_failures(row, rig.tmp / scenario.name / "web.console")
    measure.count_arrivals(row, stats, run.due)
    measure.check_calls(row, run.job_id)
    if other is not None:
        _check_other(row, other)
    measure.read_logs(row, processes)
    return row


def _api(rig: Rig, scenario: Scenario, rate: float, suffix: str = "") -> Any:
    from ratejobs.services.apis import api_create

    return api_create(
        name=f"scale-{scenario.name}{suffix}-{uuid.uuid4().hex[:6]}", base_url=rig.sandbox.url,
        rate=rate, burst=API_BURST, idempotency_header=IDEMPOTENCY_HEADER,
    )  # fmt: skip


def _apis_on_two_nodes(rig: Rig, scenario: Scenario) -> tuple[Any, Any]:
    """Two APIs at half the limit each whose limiters live on different nodes of the Cluster
    (an API's keys share one hash tag, its name)."""
    assert rig.cluster is not None
    first = _api(rig, scenario, LIMIT / 2)
    node = rig.cluster.node_of(first.name)
    for _ in range(50):
        other = _api(rig, scenario, LIMIT / 2, "-other")
        if rig.cluster.node_of(other.name) != node:
            return first, other
        other.delete()
    raise ScaleError("no API name of 50 tried hashed to another node than the first's")


def _redis_counters(rig: Rig, scenario: Scenario) -> dict[str, list[Any]]:
    """Clients of the Redis servers whose own counts are the row's Redis operations: the run's
    plain Redis, where every process of the row sends everything (broker, limiter, cache);
    in redis-cluster, the Cluster's masters (the limiters and the dispatch keys) apart from
    the plain Redis (the broker and the web's cache). None in the other rows: Sentinel's
    replication and a restarted node's counts would blur them."""
    import redis

    def plain() -> list[Any]:
        return [redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=10)]

    if scenario.redis == "plain":
        return {"": plain()}
    if scenario.redis == "cluster" and scenario.fault is None and rig.cluster is not None:
        nodes = [
            redis.Redis(host=SERVICES.address, port=port, socket_timeout=10)
            for port in rig.cluster.ports
        ]
        return {"on the Cluster (limiters, dispatch keys)": nodes,
                "on the plain Redis (broker, cache)": plain()}  # fmt: skip
    return {}


def _start_hosts(
    rig: Rig, scenario: Scenario, stop: contextlib.ExitStack, row: Row
) -> tuple[list[HostProcess], str]:
    """The web host, a worker on each worker host and beat on the first, with the row's Redis
    and clocks: started side by side (each takes seconds to import Django)."""
    # A fault's row takes faults.chaos' shorter heartbeat, reconcile and stale-dispatch times,
    # so that what the reconciler must send again goes out within the run's minutes.
    row_env = {
        **rig.redis_env(scenario.redis),
        **rig.database_env(scenario.database),
        **(CHAOS_SETTINGS if scenario.fault else {}),
    }
    plans: list[tuple[Host, str, float]] = [
        (WORKER_1, "worker", scenario.clocks[0]),
        (WORKER_1, "beat", scenario.clocks[0]),
        (WORKER_2, "worker", scenario.clocks[1]),
    ]
    if any(offset for *_, offset in plans):
        if rig.wallclock is None:
            row.problems.append("no wall-clock library (no C compiler): clocks not skewed")
            return [], ""
        seen = {
            host.name: clock.check(rig.wallclock, offset, host.exec_prefix())
            for host, _, offset in plans
        }
        row.notes += [f"{name}'s wall clock seen {skew:+.1f} s off" for name, skew in seen.items()]
    directory = rig.tmp / scenario.name
    directory.mkdir()

    def start(host: Host, what: str, offset: float) -> HostProcess:
        env = {**rig.env, **row_env, **clock.environment(rig.wallclock or Path(), offset)}
        return celery(host, what, env, directory)

    with ThreadPoolExecutor() as pool:
        futures = [pool.submit(start, *plan) for plan in plans]
        site = pool.submit(web, WEB, {**rig.env, **row_env}, directory)
    processes = []
    for future in futures:
        with contextlib.suppress(Exception):
            processes.append(future.result())
            stop.callback(processes[-1].stop)
    with contextlib.suppress(Exception):
        stop.callback(site.result()[0].stop)
    for future in [*futures, site]:
        future.result()  # the first error, once every process that started will be stopped
    return processes, site.result()[1]


@dataclass
class JobRun:
    job_id: int
    due: float  # this host's epoch: its not_before, or its submission
    samples: list[tuple[float, int]]  # progress: (monotonic time, final calls)
    struck: float | None = None  # monotonic: when FAULT_AT of its calls were done
    struck_at: float | None = None  # the same, this host's epoch (the sandbox's clock)


def _submit(rig: Rig, web_url: str, row: Row, api: str, calls: int, prefix: str = "") -> int:
    """A job of `calls` GETs of /items/{prefix}{i} submitted through the web host (with the
    row's not_before); its id."""
    body: dict[str, Any] = {
        "api": api,
        "name": f"scale {row.scenario.name} {prefix}".strip(),
        "calls": [{"method": "GET", "path": f"/items/{prefix}{i}"} for i in range(calls)],
    }
    if row.scenario.start_in:
        due = time.time() + row.scenario.start_in
        body["not_before"] = datetime.datetime.fromtimestamp(due, datetime.UTC).isoformat()
    response = rig.session.post(f"{web_url}/api/jobs/", json=body, timeout=60)
    if response.status_code != 201:
        raise ScaleError(f"job not created: {response.status_code} {response.text[:500]}")
    return response.json()["id"]


def _run_job(
    rig: Rig, web_url: str, row: Row, api: str, calls: int, fault: Callable[[], None] | None
) -> JobRun:
    """Submits the job through the web host and polls it until it ends, running `fault` once
    FAULT_AT of its calls are done."""
    due = time.time() + row.scenario.start_in
    created = time.monotonic()
    run = JobRun(_submit(rig, web_url, row, api, calls), due, [(created, 0)])
    peak = Peaks()
    timeout = row.scenario.start_in + calls / LIMIT * 2 + JOB_SLACK_SECONDS
    if row.scenario.fault:
        timeout += float(CHAOS_SETTINGS["RATEJOBS_STALE_DISPATCH_SECONDS"]) + CUT_SECONDS
    while True:
        job = rig.session.get(f"{web_url}/api/jobs/{run.job_id}/", timeout=30).json()
        now = time.monotonic()
        run.samples.append((now, job["succeeded"] + job["failed"] + job["cancelled"]))
        if len(run.samples) % PEAK_EVERY == 0:
            peak.sample(rig.pgbouncer if row.scenario.database == "pgbouncer" else None)
        if job["status"] in ("completed", "cancelled"):
            row.job_seconds = now - created
            row.notes.append(peak.say())
            return run
        if run.struck is None and run.samples[-1][1] >= calls * FAULT_AT:
            run.struck, run.struck_at = time.monotonic(), time.time()
            if fault is not None:
                fault()
        if now - created > timeout:
            row.problems.append(
                f"job not finished after {timeout:.0f} s ({run.samples[-1][1]:,}/{calls:,})"
            )
            row.notes.append(peak.say())
            return run
        time.sleep(POLL_SECONDS)


def _wait_other(rig: Rig, web_url: str, row: Row, job_id: int) -> None:
    deadline = time.monotonic() + row.calls / (LIMIT / 2) + JOB_SLACK_SECONDS
    while rig.session.get(f"{web_url}/api/jobs/{job_id}/", timeout=30).json()["status"] not in (
        "completed",
        "cancelled",
    ):
        if time.monotonic() > deadline:
            row.problems.append("the second API's job did not finish")
            return
        time.sleep(POLL_SECONDS)


def _check_other(row: Row, job_id: int) -> None:
    """The second API's job, as the row's own: every call once, all succeeded."""
    other = Row(row.scenario, row.calls)
    measure.check_calls(other, job_id)
    row.problems += [f"the second API's job: {problem}" for problem in other.problems]


def _node_down(row: Row, stats: dict[str, Any], restart: NodeRestart) -> None:
    """While the job's API's node was down: none of its requests may arrive (its limiter fails
    closed), save those granted before the kill; the second API's must go on at its rate."""
    if restart.killed_at is None or restart.started_at is None:
        return
    down = restart.started_at - restart.killed_at
    admitted = [entry for entry in stats["log"] if entry["status"] != 429]
    others = [e["t"] for e in admitted if e["path"].startswith(OTHER_PATHS)]
    own = [e["t"] for e in admitted if not e["path"].startswith(OTHER_PATHS)]
    closed = [
        t for t in own if restart.killed_at + GRANTED_BEFORE_SECONDS <= t < restart.started_at
    ]
    others = [t for t in others if restart.killed_at <= t < restart.started_at]
    back = min((t for t in own if t >= restart.started_at), default=None)
    other_pace = len(others) / down / (LIMIT / 2) if down > 0 else 0.0
    row.notes.append(
        f"node {restart.port} killed (SIGKILL) and started again {down:.1f} s later, "
        + (
            f"cluster_state ok after {restart.ok_at - restart.started_at:.1f} s"
            if restart.ok_at is not None
            else "cluster_state never ok again"
        )
        + f"; while it was down: {len(closed)} requests of its API more than "
        f"{GRANTED_BEFORE_SECONDS:g} s after the kill, {len(others):,} of the other API "
        f"({other_pace:.2f} of its {LIMIT / 2:g}/s); its API's first request after the start: "
        + ("none" if back is None else f"{back - restart.started_at:.1f} s")
    )
    if closed:
        row.problems.append(
            f"{len(closed)} requests of the API whose node was down: its limiter did not fail "
            "closed"
        )
    if other_pace < OTHER_PACE_FLOOR:
        row.problems.append(
            f"the other API kept {other_pace:.2f} of its rate while the node was down, under "
            f"{OTHER_PACE_FLOOR}"
        )


@dataclass
class Peaks:
    """The most connections seen during a job, sampled while it is polled: to PostgreSQL
    (pg_stat_activity, the run's own included) and, behind PgBouncer, to it."""

    database: int = 0
    pooler: int | None = None

    def sample(self, pgbouncer: PgBouncer | None) -> None:
        with contextlib.suppress(Exception):  # a sample missed is a sample missed
            self.database = max(self.database, measure.database_connections())
            if pgbouncer is not None:
                self.pooler = max(self.pooler or 0, pgbouncer.clients())

    def say(self) -> str:
        pooler = "" if self.pooler is None else f", to PgBouncer at most {self.pooler}"
        return f"connections during the job: to PostgreSQL at most {self.database}{pooler}"


def _failover(rig: Rig, row: Row, *, kill_old: bool) -> Callable[[], None]:
    def strike() -> None:
        from ratejobs.models import Call

        assert rig.sentinel is not None
        running = Call.objects.filter(status=Call.Status.RUNNING).count()
        before = rig.sentinel.master()
        took = rig.sentinel.failover(kill_old=kill_old)
        row.notes.append(
            f"SENTINEL FAILOVER with {running} calls running: master {before[1]} -> "
            f"{rig.sentinel.master()[1]} in {took:.1f} s"
            + (", then the old master killed (SIGKILL)" if kill_old else "")
        )

    return strike


def _throttle(rig: Rig, row: Row, stop: contextlib.ExitStack) -> Callable[[], None]:
    """The sandbox admits THROTTLE_SHARE of the limit for THROTTLE_SECONDS, its 429s telling
    when to come back as an HTTP-date, on the services host's clock: a worker that read it on
    its own clock (30 s fast) would come back at once, one 30 s slow half a minute late."""

    def restore() -> None:
        rig.sandbox.configure(real_rate=None, retry_after_format="delta")

    def strike() -> None:
        rig.sandbox.configure(real_rate=LIMIT * THROTTLE_SHARE, retry_after_format="date")
        timer = threading.Timer(THROTTLE_SECONDS, restore)
        timer.daemon = True
        timer.start()
        stop.callback(timer.cancel)
        row.notes.append(
            f"the sandbox admitted {LIMIT * THROTTLE_SHARE:g}/s for {THROTTLE_SECONDS:g} s, "
            "Retry-After as an HTTP-date"
        )

    stop.callback(restore)  # the sandbox serves the next rows at the limit, whatever happened
    return strike


def _rejoined(cut: CutOff, row: Row) -> None:
    row.problems += cut.errors
    row.notes.append(
        f"{cut.host.name} cut off for {CUT_SECONDS:g} s holding {cut.running} running calls; "
        f"{cut.left_when_back} calls not final when its link came back"
    )
    if cut.rejoined is None:
        row.problems.append(
            f"no heartbeat of {cut.host.name}'s processes {REJOIN_TIMEOUT:g} s after its link "
            "came back"
        )
    else:
        row.notes.append(
            f"{cut.host.name}'s heartbeat refreshed {cut.rejoined:.1f} s after its link came back"
        )
    if cut.took_call is not None:
        row.notes.append(f"it claimed a call again {cut.took_call:.1f} s after")
    else:
        row.notes.append("it claimed no call again before the job ended")


def _restart_pgbouncer(rig: Rig, row: Row) -> Callable[[], None]:
    def strike() -> None:
        assert rig.pgbouncer is not None
        took = rig.pgbouncer.restart()
        row.notes.append(f"PgBouncer stopped (SIGTERM) and listening again in {took:.1f} s")

    return strike


def _split_brain(sentinel: SentinelRedis, row: Row) -> None:
    discarded = sentinel.discarded_bytes()
    demoted = sentinel.demoted_after
    row.notes.append(
        "the old master became a replica "
        + ("(not seen)" if demoted is None else f"{demoted:.1f} s after SENTINEL FAILOVER")
        + ": until then it answered every process still connected to it"
        + ("" if discarded is None else f", {discarded:,} bytes of them dropped with its resync")
    )


def _probe(rig: Rig, web_url: str, row: Row, api: str) -> None:
    """After the fault: /healthz, and one call submitted through the web host and run."""
    health = rig.session.get(f"{web_url}/healthz", timeout=30)
    checks = health.json().get("checks", {}) if health.ok else {}
    row.notes.append(
        f"/healthz after the fault: {health.status_code} "
        + ", ".join(f"{name} {check.get('status')}" for name, check in checks.items())
    )
    body = {"api": api, "name": "probe", "calls": [{"method": "GET", "path": "/items/probe"}]}
    response = rig.session.post(f"{web_url}/api/jobs/", json=body, timeout=60)
    if response.status_code != 201:
        row.problems.append(
            f"a job submitted after the fault was refused: {response.status_code} "
            f"{response.text[:200]}"
        )
        return
    url = f"{web_url}/api/jobs/{response.json()['id']}/"
    deadline = time.monotonic() + PROBE_TIMEOUT
    while rig.session.get(url, timeout=30).json()["status"] != "completed":
        if time.monotonic() > deadline:
            row.problems.append(f"a job submitted after the fault not done in {PROBE_TIMEOUT:g} s")
            return
        time.sleep(POLL_SECONDS)
    row.notes.append("a job submitted after the fault completed")


def _export(rig: Rig, web_url: str, row: Row, job_id: int) -> None:
    """The job's results as CSV through the web host, read as they come: every call once, and
    streamed (chunked, no Content-Length), not built whole first."""
    began = time.monotonic()
    with rig.session.get(
        f"{web_url}/api/jobs/{job_id}/results.csv", stream=True, timeout=60
    ) as response:
        if response.status_code != 200:
            row.problems.append(f"results.csv answered {response.status_code}")
            return
        pieces = response.iter_content(chunk_size=None)
        first = next(pieces, b"")
        first_byte = time.monotonic() - began
        body = first + b"".join(pieces)
    records = len(list(csv.reader(io.StringIO(body.decode())))) - 1  # less the header
    streamed = "Content-Length" not in response.headers
    row.notes.append(
        f"results.csv through the web host: {records:,} rows, {len(body):,} bytes, first bytes "
        f"after {first_byte:.2f} s, all after {time.monotonic() - began:.2f} s, "
        + ("streamed (chunked)" if streamed else "with a Content-Length (not streamed)")
    )
    if records != row.calls:
        row.problems.append(f"results.csv: {records:,} rows for {row.calls:,} calls")
    if not streamed:
        row.problems.append("results.csv came with a Content-Length: not streamed")


def _keep_logs_if_failed(rows: Sequence[Row], tmp: Path) -> None:
    if rows and all(row.result == "pass" for row in rows) and not os.environ.get(KEEP_LOGS):
        return
    shutil.rmtree(FAILED_LOGS, ignore_errors=True)
    FAILED_LOGS.mkdir(parents=True)
    for log in [*tmp.glob("*.log"), *tmp.glob("*/*.log"), *tmp.glob("*/*.console"),
                *tmp.glob("*/*/*.log")]:  # fmt: skip
        name = "-".join(log.relative_to(tmp).parts)
        with contextlib.suppress(OSError):
            shutil.copy(log, FAILED_LOGS / name)
    _progress(f"logs kept in {FAILED_LOGS}")


def date_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _progress(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


# -- the command ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    from bench import scale

    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=scale.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help="calls per job")
    default = [name for name, scenario in SCENARIOS.items() if scenario.default]
    others = [name for name in SCENARIOS if name not in default]
    parser.add_argument(
        "--only",
        default=",".join(default),
        help=f"rows to run, of: {', '.join(default)} (the default: all of these); and, only "
        f"when named: {', '.join(others)}",
    )
    parser.add_argument(
        "--clean", action="store_true", help="remove the rjs-* namespaces of an interrupted run"
    )
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # each row once, in the order given
    args.scenarios = list(dict.fromkeys(n.strip() for n in args.only.split(",") if n.strip()))
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown or not args.scenarios:
        parser.error(f"--only: unknown row(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    if args.calls < 100:
        parser.error("--calls must be at least 100")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        if args.clean:
            removed = net.clean()
            print(f"removed: {', '.join(removed) or 'nothing'}")
            return 0
        if args.inside:
            return inside(args)
        return outside(argv)
    except (ScaleError, HostError, ChaosError, BenchError, SentinelError, net.TopologyError,
            clock.ClockError, PgBouncerError, ClusterError) as exc:  # fmt: skip
        _progress(f"stopped: {exc}")
        return 2
