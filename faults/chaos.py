"""The fault suite (`make chaos`): real workers, beat, PostgreSQL, Redis and the sandbox run one
job per fault while that fault strikes it; prints one markdown table, exits 1 when a row breaks
an invariant.

    python -m faults.chaos [--calls N] [--only FAULT[,FAULT...]] [--no-postgres] [--record]

Everything it runs is its own and is removed at the end, so that it may restart them: a
PostgreSQL cluster made with initdb in a temporary directory on a free port (SQLite when this
machine has no PostgreSQL binaries, or with --no-postgres; the postgres-restart row is then
skipped), one redis-server on a free port serving as broker and limiter (database 15, as
bench.jobs uses it), the sandbox, two `celery -A project worker -c 2` and `celery -A project
beat`. The machine's own PostgreSQL and Redis, and DATABASE_URL and REDIS_URL, are never used.

Each row submits a fresh job of N GET calls (default 2,000) to an API limited to 200/s that sends
an Idempotency-Key header, against a sandbox enforcing 200/s; the fault strikes once a quarter of
the calls are done. A row passes when the job completes, every call has one final state and
succeeded, nothing stays running, the requests the sandbox answered beyond one per call are no
more than the calls in flight at the fault, none of them is an effective duplicate (where
the sandbox and the workers support the header), and the fault's own checks find that it struck
what it means to (the snapshot loaded, the lost calls waited for beat, ratejobs was refused).
docs/reliability.md defines every column and check; --record writes the table there.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import datetime
import itertools
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from bench.jobs import BENCH_REDIS_DB, PROJECT_ROOT, BenchError, Setup, Worker, bench_setup
from devtools import devredis
from devtools.processes import ci_requires_every_check, group_pids, stop_process_group

T = TypeVar("T")

DEFAULT_CALLS = 2_000
# The API's limit in ratejobs and the one the sandbox enforces: 2,000 calls in 10 s at that
# pace, about 15 s on a busy 2-core machine.
API_RATE = 200.0
API_BURST = 10
# The sandbox's burst at that rate: room for the jitter of a loaded 2-core machine (a request
# sent at its slot may arrive late, beside the next one), a quarter second of calls, no more.
SANDBOX_BURST = 50
IDEMPOTENCY_HEADER = "Idempotency-Key"
WORKERS = 2
WORKER_CONCURRENCY = 2
# The fault strikes once this share of the job is done, so the pace before it can be measured
# and most of the job runs after it; the older snapshot is taken earlier.
FAULT_AT = 0.25
SNAPSHOT_AT = 0.05
# How long PostgreSQL and Redis stay down when restarted, and the broker stays full.
OUTAGE_SECONDS = 2.0
FULL_SECONDS = 5.0
# maxmemory is set this far above what the broker uses, then filled with junk of this size in
# a database nothing else uses.
MAXMEMORY_HEADROOM = 4 * 2**20
JUNK_VALUE_BYTES = 256 * 2**10
# While full, freed memory is taken again in pieces of this size, this often.
TOP_UP_BYTES = 16 * 2**10
TOP_UP_SECONDS = 0.01
JUNK_DB = 1  # never BENCH_REDIS_DB, where the broker and the limiter keep theirs
# Progress is read this often; the pace is judged over windows of PACE_WINDOW seconds.
SAMPLE_SECONDS = 0.1
PACE_WINDOW = 1.0
# Longest wait for the trigger of a fault, and for the job's end after the fault's recovery.
TRIGGER_TIMEOUT = 60.0
JOB_TIMEOUT = 150.0
# A request sent by a worker that was presumed dead arrives after the job is complete.
SETTLE_SECONDS = 1.0
DB_RETRY_SECONDS = 30.0
# Calls of a cancelled job finish their attempt within seconds; a minute is something stuck.
QUIET_TIMEOUT = 60.0
SUPERVISE_SECONDS = 0.5
PG_TIMEOUT = 90.0
# Shorter than the defaults (5, 30, 30 and 120 s; 2 and 10 s are the test settings'), so that
# the recovery from a lost message or a dead worker fits the suite's few minutes.
CHAOS_SETTINGS = {
    "RATEJOBS_WORKER_HEARTBEAT_SECONDS": "2",
    "RATEJOBS_WORKER_DEAD_AFTER": "10",
    "RATEJOBS_RECONCILE_INTERVAL": "5",
    "RATEJOBS_STALE_DISPATCH_SECONDS": "15",
}
# Beat stays stopped this long after the messages are lost: a running reconciler would have sent
# their calls again by then (stale after RATEJOBS_STALE_DISPATCH_SECONDS, found at its next run),
# with one interval more to spare, so calls still waiting then were waiting for beat.
BEAT_DOWN_SECONDS = float(CHAOS_SETTINGS["RATEJOBS_STALE_DISPATCH_SECONDS"]) + 2 * float(
    CHAOS_SETTINGS["RATEJOBS_RECONCILE_INTERVAL"]
)
# Longest wait for a message of calls in the broker's queue (not yet taken by a worker) to lose.
LOSE_TIMEOUT = 10.0
BEAT_START_TIMEOUT = 60.0
LOG_ERROR = re.compile(r": (ERROR|CRITICAL)/")
DOC = PROJECT_ROOT / "docs" / "reliability.md"
# The markers around the table in docs/reliability.md: change both together.
DOC_BEGIN = "<!-- chaos table: written by `python -m faults.chaos --record` -->"
DOC_END = "<!-- end of chaos table -->"
FAILED_LOGS = PROJECT_ROOT / "artifacts" / "chaos"


class ChaosError(RuntimeError):
    pass


# -- the suite's own PostgreSQL and Redis -------------------------------------------------------


def postgres_bindir() -> Path | None:
    """Where initdb and pg_ctl are: pg_config's answer, the PATH, or Debian's versioned
    directories (newest first)."""
    candidates = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            answer = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(Path(answer.stdout.strip()))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    versions = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(versions, key=lambda p: _version(p.parent.name), reverse=True)
    for directory in candidates:
        if all(os.access(directory / tool, os.X_OK) for tool in ("initdb", "pg_ctl")):
            return directory
    return None


def _version(name: str) -> float:
    try:
        return float(name)
    except ValueError:
        return 0.0


class PrivatePostgres:
    """A PostgreSQL cluster of the suite's own: initdb in a temporary directory, served on a
    free port of 127.0.0.1 and a socket in that directory."""

    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir, self.root = bindir, root
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.port = devredis.free_port()
        # initdb and the server refuse to run as root: as root, they run as the postgres user.
        self._as_user: str | None = None
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise ChaosError("running as root and there is no postgres user") from None
            self._as_user = user.pw_name
            os.chown(root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync")  # fmt: skip

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        # fsync off: a killed server loses nothing the operating system already holds, which is
        # all a restart of the process tests, and the shared machine's disk is spared.
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """`immediate` is a crash: no checkpoint, connections cut, recovery at the next start."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bindir / tool), *args]
        if self._as_user is not None:
            runuser, su = shutil.which("runuser"), shutil.which("su")
            if runuser:
                argv = [runuser, "-u", self._as_user, "--", *argv]
            elif su:
                argv = [su, self._as_user, "-c", shlex.join(argv)]
            else:
                raise ChaosError("running as root, and neither runuser nor su to drop it")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PG_TIMEOUT)
        if done.returncode:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise ChaosError(f"{tool} failed ({done.returncode}): {done.stderr}{done.stdout}{log}")


class PrivateRedis:
    """A redis-server of the suite's own on one port for its whole life: restarted empty, or
    from the snapshot SAVE wrote (nothing else ever writes one)."""

    SNAPSHOT = "chaos.rdb"

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.port = devredis.free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.server: devredis.RedisServer | None = None

    def start(self) -> None:
        self.server = devredis.start_private_redis(
            port=self.port,
            logfile=self.root / "redis.log",
            extra_args=["--dir", str(self.root), "--dbfilename", self.SNAPSHOT],
        )

    def stop(self) -> None:
        if self.server is None:
            return
        client = self.client()
        with contextlib.suppress(redis.RedisError):
            client.shutdown(nosave=True)
        client.close()
        self.server.stop()
        self.server = None

    def forget_snapshot(self) -> None:
        (self.root / self.SNAPSHOT).unlink(missing_ok=True)

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, socket_timeout=10)


class Beat:
    """`celery -A project beat` in its own process group, appending to one log."""

    def __init__(self, env: dict[str, str], directory: Path) -> None:
        self.log = directory / "beat.log"
        start = self.log.stat().st_size if self.log.exists() else 0
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "project", "beat", "-l", "INFO",
             "-s", str(directory / "beat-schedule"), "--pidfile=", "-f", str(self.log)],
            cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + BEAT_START_TIMEOUT
        while "beat: Starting" not in _read(self.log, start):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ChaosError(f"beat did not start:\n{_read(self.log, start)[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        stop_process_group(self.process, 20)


def _read(path: Path, start: int = 0) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


# -- the rig and its faults ---------------------------------------------------------------------


@dataclass
class Rig:
    setup: Setup
    tmp: Path
    postgres: PrivatePostgres | None
    redis: PrivateRedis
    sandbox: Any  # sandbox.SandboxProcess
    api: Any  # ratejobs.models.Api
    workers: list[Worker]
    beat: Beat | None
    killed: list[Worker] = field(default_factory=list)  # main process killed, group left
    notes: list[str] = field(default_factory=list)  # what a fault or the supervisor saw
    problems: list[str] = field(default_factory=list)  # what a fault's own checks found wrong
    started: list[Worker] = field(default_factory=list)  # every worker, for their logs
    # Held while a fault or the supervisor changes which processes run.
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def new_worker(self) -> Worker:
        worker = Worker(
            self.setup.env, WORKER_CONCURRENCY, self.tmp / f"worker-{next(self.numbers)}.log"
        )
        self.started.append(worker)
        return worker

    def supervise(self) -> None:
        """What compose's `restart: unless-stopped` does: a worker or beat that exited by
        itself is started again, and again while it fails to start (beat only while no fault
        keeps it stopped)."""
        owed, beat_owed = 0, False
        while not self.stopping.wait(SUPERVISE_SECONDS):
            with self.lock:
                dead = [w for w in self.workers if w.process.poll() is not None]
                for worker in dead:
                    self.workers.remove(worker)
                if self.beat is not None and self.beat.process.poll() is not None:
                    self.beat, beat_owed = None, True
                    self.notes.append("beat exited by itself")
            for worker in dead:
                why = [line for line in worker.text().splitlines() if "CRITICAL/" in line]
                self.notes.append(
                    f"a worker exited by itself (status {worker.process.returncode})"
                    + (f": {why[-1][:200]}" if why else "")
                )
            owed += len(dead)
            try:
                while owed:
                    worker = self.new_worker()
                    with self.lock:
                        self.workers.append(worker)
                    owed -= 1
                    self.notes.append("a worker was started in place of the one that exited")
                if beat_owed:
                    beat = Beat(self.setup.env, self.tmp)
                    with self.lock:
                        self.beat, beat_owed = beat, False
            except (BenchError, ChaosError) as exc:
                lines = [line for line in str(exc).splitlines() if line.strip()]
                why = [line for line in lines if "CRITICAL/" in line] or lines[-1:]
                self.notes.append(f"a replacement did not start, tried again: {why[-1][:200]}")


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    strike: Callable[[Rig], None]  # the fault itself
    recover: Callable[[Rig], None]  # what a supervisor or an operator does next
    early: Callable[[Rig], None] | None = None  # at SNAPSHOT_AT, before the fault
    check: Callable[[Rig, int], None] | None = None  # after the job (its id), besides the rest
    needs_postgres: bool = False


def _nothing(rig: Rig) -> None:
    pass


def kill_worker(rig: Rig) -> None:
    with rig.lock:
        victim = rig.workers.pop(0)
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait()
        rig.killed.append(victim)


def start_worker(rig: Rig) -> None:
    worker = rig.new_worker()
    with rig.lock:
        rig.workers.append(worker)


def crash_postgres(rig: Rig) -> None:
    assert rig.postgres is not None
    rig.postgres.stop("immediate")


def restart_postgres(rig: Rig) -> None:
    assert rig.postgres is not None
    time.sleep(OUTAGE_SECONDS)
    rig.postgres.start()


def stop_redis(rig: Rig) -> None:
    rig.redis.stop()


def start_redis_empty(rig: Rig) -> None:
    rig.redis.forget_snapshot()
    time.sleep(OUTAGE_SECONDS)
    rig.redis.start()


class SnapshotRollback:
    """redis-snapshot: a key written just before SAVE and another just after it, in the broker's
    and the limiter's database. Redis must come back with the first (it loaded the snapshot,
    not nothing) and without the second (it rolled back, rather than kept what came after)."""

    BEFORE = "chaos:snapshot:before-save"
    AFTER = "chaos:snapshot:after-save"

    def __init__(self) -> None:
        self.token = ""

    def save(self, rig: Rig) -> None:
        self.token = uuid.uuid4().hex
        client = rig.redis.client(BENCH_REDIS_DB)
        try:
            client.set(self.BEFORE, self.token)
            client.save()
            client.set(self.AFTER, self.token)
        finally:
            client.close()

    def restart(self, rig: Rig) -> None:
        time.sleep(OUTAGE_SECONDS)
        rig.redis.start()
        client = rig.redis.client(BENCH_REDIS_DB)
        try:
            before, after = client.get(self.BEFORE), client.get(self.AFTER)
            client.delete(self.BEFORE, self.AFTER)
        finally:
            client.close()
        if before != self.token.encode():
            rig.problems.append(
                "Redis did not come back from the snapshot: the key written before SAVE is "
                + ("missing" if before is None else "another run's")
            )
        if after is not None:
            rig.problems.append("Redis did not roll back: the key written after SAVE is there")
        if before == self.token.encode() and after is None:
            rig.notes.append(
                "Redis came back from the snapshot: the key written before SAVE was there, the "
                "one written after it was not"
            )


def stop_beat(rig: Rig) -> None:
    with rig.lock:
        beat, rig.beat = rig.beat, None
    if beat is not None:
        beat.stop()


def start_beat(rig: Rig) -> None:
    beat = Beat(rig.setup.env, rig.tmp)
    with rig.lock:
        rig.beat = beat


class LostMessages:
    """beat-stop: beat stopped, then the messages of calls waiting in the broker's queue deleted
    (a broker that lost them). Their calls stay in the dispatch window, marked as sent, until
    beat's reconciler finds them stale and sends them again: nothing else does while their
    dispatcher lives. They must still be waiting when beat starts again, and run after."""

    def __init__(self) -> None:
        self.lost: dict[int, datetime.datetime | None] = {}  # call id: its dispatched_at
        self.lost_at = 0.0
        self.beat_back: datetime.datetime | None = None

    def strike(self, rig: Rig) -> None:
        from ratejobs.models import Call

        self.lost, self.beat_back = {}, None
        stop_beat(rig)
        deadline = time.monotonic() + LOSE_TIMEOUT
        messages, call_ids = 0, []
        while not call_ids and time.monotonic() < deadline:
            messages, call_ids = _delete_call_messages(rig)
            if not call_ids:
                time.sleep(SAMPLE_SECONDS / 2)
        self.lost_at = time.monotonic()
        if not call_ids:
            rig.problems.append(
                f"no message of calls waited in the broker's queue for {LOSE_TIMEOUT:g} s: "
                "nothing was lost, the fault did not strike"
            )
            return
        self.lost = dict(
            _db(
                lambda: list(
                    Call.objects.filter(pk__in=call_ids).values_list("pk", "dispatched_at")
                )
            )
        )
        rig.notes.append(f"deleted {messages} messages of {len(call_ids)} calls from the broker")

    def recover(self, rig: Rig) -> None:
        from ratejobs.infra.clock import database_now
        from ratejobs.models import Call

        time.sleep(max(0.0, self.lost_at + BEAT_DOWN_SECONDS - time.monotonic()))
        if self.lost:
            waiting = _db(
                lambda: list(
                    Call.objects.filter(
                        pk__in=list(self.lost), status=Call.Status.PENDING
                    ).values_list("pk", "dispatched_at")
                )
            )
            # still marked as sent at the time their lost message was (not sent again since)
            untouched = sum(self.lost[pk] is not None and self.lost[pk] == at for pk, at in waiting)
            if untouched != len(self.lost):
                rig.problems.append(
                    f"{len(self.lost) - untouched} of the {len(self.lost)} calls whose message "
                    "was deleted were sent again while beat was stopped: the row does not "
                    "depend on beat"
                )
            else:
                rig.notes.append(
                    f"all {untouched} were still waiting, unsent, {BEAT_DOWN_SECONDS:g} s later "
                    "with beat stopped"
                )
        self.beat_back = _db(database_now)
        start_beat(rig)

    def check(self, rig: Rig, job_id: int) -> None:
        """The lost calls finished after beat was back (the job's checks say they succeeded)."""
        from django.db.models import Max, Min

        from ratejobs.models import Call

        if not self.lost or self.beat_back is None:
            return
        lost = Call.objects.filter(pk__in=list(self.lost))
        early = _db(lost.filter(finished__lt=self.beat_back).count)
        if early:
            rig.problems.append(
                f"{early} of the calls whose message was deleted finished before beat was back"
            )
            return
        span = _db(lambda: lost.aggregate(first=Min("finished"), last=Max("finished")))
        if span["first"] is not None and span["last"] is not None:
            first, last = (
                (span[end] - self.beat_back).total_seconds() for end in ("first", "last")
            )
            rig.notes.append(
                f"they finished {first:.1f} to {last:.1f} s after beat was started again"
            )


def _delete_call_messages(rig: Rig) -> tuple[int, list[int]]:
    """Deletes the messages of calls (execute_calls) waiting in the broker's default queue;
    returns how many, and their calls. A message a worker took meanwhile is left to it."""
    from django.conf import settings

    from ratejobs.celery_settings import EXECUTE_CALLS_TASK

    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("global_keyprefix", "")
    queue = f"{prefix}{settings.CELERY_TASK_DEFAULT_QUEUE}"
    client = rig.redis.client(BENCH_REDIS_DB)
    messages, call_ids = 0, []
    try:
        for raw in client.lrange(queue, 0, -1):
            message = json.loads(raw)
            if message.get("headers", {}).get("task") != EXECUTE_CALLS_TASK:
                continue
            if not client.lrem(queue, 1, raw):
                continue
            body = message["body"]
            if message.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            args, _kwargs, _embed = json.loads(body)  # Celery's message protocol 2
            messages += 1
            call_ids += args[1]
    finally:
        client.close()
    return messages, call_ids


class BrokerFull:
    """broker-maxmemory: maxmemory just above what the broker holds, then junk until a write
    is refused. The OOM refusals Redis counts while full, less the suite's own (its junk writes,
    each counted as it is refused), are the ratejobs processes' (workers and beat): nothing
    else uses this Redis while the row runs."""

    def __init__(self) -> None:
        self.memory_config: dict[str, str] = {}
        self.junk_refused = 0

    def fill(self, rig: Rig) -> None:
        client = rig.redis.client()
        self.memory_config = client.config_get("maxmemory*")
        client.config_resetstat()  # errorstats count from here: the OOMs of this fault alone
        used = client.info("memory")["used_memory"]
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", used + MAXMEMORY_HEADROOM)
        client.close()
        self.junk_refused = _add_junk(rig, JUNK_VALUE_BYTES, until=time.monotonic() + 60)
        if not self.junk_refused:
            raise ChaosError("the broker's Redis never refused a write at its maxmemory")

    def empty(self, rig: Rig) -> None:
        # Memory the workers free (messages taken from the queue) is taken again at once, so
        # the broker stays full for the whole time, not for the one write that found it full.
        self.junk_refused += _add_junk(
            rig, TOP_UP_BYTES, until=time.monotonic() + FULL_SECONDS, keep_on=True
        )
        junk = rig.redis.client(JUNK_DB)
        junk.flushdb()
        junk.close()
        client = rig.redis.client()
        refused = client.info("errorstats").get("errorstat_OOM", {}).get("count", 0)
        for name in ("maxmemory", "maxmemory-policy"):
            client.config_set(name, self.memory_config[name])
        client.close()
        app = refused - self.junk_refused
        rig.notes.append(
            f"Redis refused {app:,} commands of ratejobs' processes with OOM while full (and "
            f"{self.junk_refused:,} of the suite's own junk writes)"
        )
        if app <= 0:
            rig.problems.append(
                "Redis refused no command of ratejobs' processes: the fault never reached them"
            )


def _add_junk(rig: Rig, size: int, *, until: float, keep_on: bool = False) -> int:
    """Junk keys of `size` bytes until a write is refused, or with `keep_on` until `until`,
    waiting a moment after each refusal; returns how many writes were refused."""
    junk = rig.redis.client(JUNK_DB)
    value = b"x" * size
    refused = 0
    try:
        while time.monotonic() < until:
            try:
                junk.set(f"chaos:junk:{uuid.uuid4().hex}", value)
            except redis.OutOfMemoryError:
                refused += 1
                if not keep_on:
                    break
                time.sleep(TOP_UP_SECONDS)
        return refused
    finally:
        junk.close()


SNAPSHOT = SnapshotRollback()
LOST_MESSAGES = LostMessages()
BROKER_FULL = BrokerFull()

FAULTS = {
    fault.name: fault
    for fault in [
        Fault("none", "no fault: the baseline", _nothing, _nothing),
        Fault(
            "worker-kill",
            "kill -9 of one worker's main process (not of its pool), a new worker started",
            kill_worker,
            start_worker,
        ),
        Fault(
            "postgres-restart",
            f"PostgreSQL stopped in immediate mode (a crash), started {OUTAGE_SECONDS:g} s later",
            crash_postgres,
            restart_postgres,
            needs_postgres=True,
        ),
        Fault(
            "redis-restart",
            f"Redis (broker and limiter) shut down without saving, started empty "
            f"{OUTAGE_SECONDS:g} s later",
            stop_redis,
            start_redis_empty,
        ),
        Fault(
            "redis-snapshot",
            f"a key written, Redis saved and another key written at {SNAPSHOT_AT:.0%} of the "
            f"job, shut down at {FAULT_AT:.0%}, started {OUTAGE_SECONDS:g} s later from that "
            "snapshot (queue, limiter and leases roll back; the first key must be back, the "
            "second gone)",
            stop_redis,
            SNAPSHOT.restart,
            early=SNAPSHOT.save,
        ),
        Fault(
            "beat-stop",
            f"beat stopped and the messages of calls waiting in the broker deleted; beat "
            f"started {BEAT_DOWN_SECONDS:g} s later (their calls must wait until then)",
            LOST_MESSAGES.strike,
            LOST_MESSAGES.recover,
            check=LOST_MESSAGES.check,
        ),
        Fault(
            "broker-maxmemory",
            f"the broker's Redis filled to its maxmemory (writes refused with OOM) for "
            f"{FULL_SECONDS:g} s, then emptied",
            BROKER_FULL.fill,
            BROKER_FULL.empty,
        ),
    ]
}


# -- one row ------------------------------------------------------------------------------------


@dataclass
class Row:
    fault: str
    calls: int
    arrivals: int | None = None  # reached the sandbox: its arrivals and idempotent replays
    throttled: int = 0
    duplicates: int | None = None
    in_flight: int | None = None
    effective: int | None = None  # None: the sandbox or the workers do not do idempotency
    recover: float | None = None
    job_seconds: float | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def result(self) -> str:
        if self.skipped is not None:
            return "skipped"
        return "pass" if not self.problems else "**FAIL**"


class ProgressSampler:
    """The job's final calls every SAMPLE_SECONDS, read on a thread and a database connection
    of its own (nothing is read while the database is down)."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.samples: list[tuple[float, int]] = []  # (time.monotonic(), final calls)
        self.finished_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-progress", daemon=True)
        self._thread.start()

    @property
    def done(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def _run(self) -> None:
        from django.db import Error, connection

        from ratejobs.models import Job

        finished = (Job.Status.COMPLETED, Job.Status.CANCELLED)
        query = Job.objects.filter(pk=self.job_id).values_list(
            "succeeded", "failed", "cancelled", "status"
        )
        while not self._stop.is_set():
            try:
                succeeded, failed, cancelled, status = query.get()
            except Error:
                with contextlib.suppress(Error):
                    connection.close()
            else:
                now = time.monotonic()
                self.samples.append((now, succeeded + failed + cancelled))
                if status in finished and self.finished_at is None:
                    self.finished_at = now
            self._stop.wait(SAMPLE_SECONDS)
        with contextlib.suppress(Error):
            connection.close()

    def wait(self, until: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                return False
            time.sleep(SAMPLE_SECONDS / 2)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def done_at(samples: Sequence[tuple[float, int]], moment: float) -> int:
    """Final calls at `moment`, as last read before it."""
    index = bisect.bisect_right(samples, (moment, float("inf"))) - 1
    return samples[index][1] if index >= 0 else 0


def recovery_seconds(samples: Sequence[tuple[float, int]], struck: float) -> float:
    """From the fault to the end of the last PACE_WINDOW, before the job's last call, in which
    fewer calls finished than half the pace of the window before the fault; 0 when the pace
    never fell that low."""
    if not samples:
        return float("nan")
    final = samples[-1][1]
    last_call = next(t for t, done in samples if done == final)
    before = done_at(samples, struck) - done_at(samples, struck - PACE_WINDOW)
    threshold = max(before, 1) / 2
    slow_until = struck
    start = struck
    while start + PACE_WINDOW <= last_call:
        end = start + PACE_WINDOW
        if done_at(samples, end) - done_at(samples, start) < threshold:
            slow_until = end
        start += SAMPLE_SECONDS
    return slow_until - struck


def run_row(rig: Rig, fault: Fault, calls: int) -> Row:
    from ratejobs.services.jobs import job_create

    row = Row(fault.name, calls)
    if fault.needs_postgres and rig.postgres is None:
        row.skipped = "no PostgreSQL (SQLite)"
        return row
    _progress(f"{fault.name}: {fault.what}")
    _wait_quiet()
    rig.sandbox.reset()
    logs = {worker: worker.log_size() for worker in rig.started}
    created = time.monotonic()
    job = job_create(
        owner=rig.setup.owner,
        api=rig.api,
        name=f"chaos: {fault.name}",
        calls=({"method": "GET", "path": f"/items/{i}"} for i in range(calls)),
    )
    sampler = ProgressSampler(job.pk)
    try:
        if fault.early is not None:
            _trigger(sampler, calls, SNAPSHOT_AT)
            fault.early(rig)
        _trigger(sampler, calls, FAULT_AT)
        before = _running(job.pk, retry=True)
        struck = time.monotonic()
        fault.strike(rig)
        after = _running(job.pk, retry=False)  # None when the database is what is down
        fault.recover(rig)
        row.in_flight = max(before, after or 0)
        _progress(
            f"{fault.name}: struck at {done_at(sampler.samples, struck):,} calls done, "
            f"{row.in_flight} in flight; recovered in {time.monotonic() - struck:.1f} s"
        )
        if not sampler.wait(lambda: sampler.finished_at is not None, JOB_TIMEOUT):
            row.problems.append(
                f"job not finished {JOB_TIMEOUT:g} s after the fault ({sampler.done:,}/{calls:,})"
            )
    finally:
        sampler.stop()
    pace = done_at(sampler.samples, struck) - done_at(sampler.samples, struck - PACE_WINDOW)
    row.notes.append(f"pace in the second before the fault: {pace / PACE_WINDOW:.0f} calls/s")
    if sampler.finished_at is not None:
        row.job_seconds = sampler.finished_at - created
        row.recover = recovery_seconds(sampler.samples, struck)
    time.sleep(SETTLE_SECONDS)
    _check_calls(row, job.pk)
    if fault.check is not None:
        fault.check(rig, job.pk)
    if sampler.finished_at is not None:
        _count_arrivals(row, rig.sandbox.stats(detail=True), str(job.uuid))
    else:
        _db(lambda: _cancel(job.pk))
    _check_processes(row, rig, logs)
    return row


def _wait_quiet() -> None:
    """Until no call of an earlier row runs: its requests would count in this row."""
    from ratejobs.models import Call

    running = Call.objects.filter(status=Call.Status.RUNNING)
    deadline = time.monotonic() + QUIET_TIMEOUT
    while _db(running.exists):
        if time.monotonic() > deadline:
            raise ChaosError(f"calls of an earlier row still running after {QUIET_TIMEOUT:g} s")
        time.sleep(0.5)


def _trigger(sampler: ProgressSampler, calls: int, share: float) -> None:
    wanted = max(1, int(calls * share))
    if not sampler.wait(lambda: sampler.done >= wanted or sampler.finished_at, TRIGGER_TIMEOUT):
        raise ChaosError(f"the job did not reach {wanted:,} calls in {TRIGGER_TIMEOUT:g} s")


def _running(job_id: int, *, retry: bool) -> int | None:
    from ratejobs.models import Call

    query = Call.objects.filter(job_id=job_id, status=Call.Status.RUNNING)
    if retry:
        return _db(query.count)
    from django.db import Error, connection

    try:
        return query.count()
    except Error:
        with contextlib.suppress(Error):
            connection.close()
        return None


def _db(query: Callable[[], T]) -> T:
    """`query` in this thread, again on a new connection while the database restarts."""
    from django.db import Error, connection

    deadline = time.monotonic() + DB_RETRY_SECONDS
    while True:
        try:
            return query()
        except Error:
            with contextlib.suppress(Error):
                connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _cancel(job_id: int) -> None:
    from ratejobs.models import Job
    from ratejobs.services.jobs import job_cancel

    job_cancel(job=Job.objects.get(pk=job_id))


def _check_calls(row: Row, job_id: int) -> None:
    """The job completed; each call is in one final state, counted once in the job."""
    from django.db.models import Count

    from ratejobs.models import Call, Job

    def read() -> tuple[Any, dict[str, int], int]:
        job = Job.objects.get(pk=job_id)
        by_status = dict(
            Call.objects.filter(job_id=job_id).values_list("status").annotate(n=Count("pk"))
        )
        return job, by_status, Call.objects.filter(status=Call.Status.RUNNING).count()

    job, by_status, running_anywhere = _db(read)
    if job.status != Job.Status.COMPLETED:
        row.problems.append(f"job {job.status}, not completed")
    unfinished = {s: by_status.get(s, 0) for s in (Call.Status.PENDING, Call.Status.RUNNING)}
    if any(unfinished.values()) or running_anywhere:
        row.problems.append(
            f"calls not final: {unfinished['pending']} pending, {unfinished['running']} running "
            f"({running_anywhere} running in all jobs)"
        )
    counted = {s: getattr(job, s) for s in Call.FINAL}
    if any(counted[s] != by_status.get(s, 0) for s in Call.FINAL) or job.total != row.calls:
        row.problems.append(f"the job counts {counted} of {job.total}, its calls are {by_status}")
    not_succeeded = row.calls - by_status.get(Call.Status.SUCCEEDED, 0)
    if not_succeeded:
        row.problems.append(f"{not_succeeded} calls did not succeed (the sandbox fails none)")


def _count_arrivals(row: Row, stats: dict[str, Any], job_key: str) -> None:
    """Requests that reached the sandbox, duplicates (answered requests beyond one per call,
    429s aside) and, where keys were sent and the sandbox honours them, effective duplicates."""
    foreign = sum(
        not (entry.get("idempotency_key") or job_key).startswith(job_key)
        for entry in stats.get("log", [])
    )
    if foreign:
        row.problems.append(f"{foreign} requests of another job reached the sandbox in this row")
    # A replay and a conflict (409: the key's first request still being answered) reached the
    # sandbox too, though it did not act on them.
    replays = stats.get("idempotent_replays", 0) + stats.get("idempotent_conflicts", 0)
    row.arrivals = stats["arrivals"] + replays
    row.throttled = stats["throttled"]
    row.duplicates = row.arrivals - row.throttled - row.calls
    if row.in_flight is not None and row.duplicates > row.in_flight:
        row.problems.append(
            f"{row.duplicates} duplicates, more than the {row.in_flight} calls in flight"
        )
    keys = stats.get("unique_keys")
    if "idempotent_replays" not in stats or keys is None:
        row.notes.append("the sandbox does not report idempotent replays: no effective count")
        return
    if not keys:
        row.notes.append(f"no {IDEMPOTENCY_HEADER} reached the sandbox: no effective count")
        return
    row.effective = stats["arrivals"] - row.throttled - row.calls
    if row.effective:
        row.problems.append(f"{row.effective} effective duplicates with {IDEMPOTENCY_HEADER}")
    if keys != row.calls:
        row.problems.append(f"{keys} distinct {IDEMPOTENCY_HEADER} values for {row.calls} calls")


def _check_processes(row: Row, rig: Rig, logs: dict[Worker, int]) -> None:
    """What the fault and the supervisor saw, what is left of a killed worker's group (then
    killed), and errors in the workers' logs."""
    row.problems += rig.problems
    row.notes += rig.notes
    rig.problems.clear()
    rig.notes.clear()
    for worker in rig.killed:
        left = group_pids(worker.process.pid)
        if left:
            row.notes.append(
                f"{len(left)} pool processes of the killed worker were still running after the "
                "job (killed now)"
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGKILL)
    rig.killed.clear()
    errors = [
        line
        for worker in rig.started
        for line in worker.text(logs.get(worker, 0)).splitlines()
        if LOG_ERROR.search(line)
    ]
    if errors:
        row.notes.append(f"worker logs: {len(errors)} ERROR lines, first: {errors[0][:200]}")


# -- the run ------------------------------------------------------------------------------------


COLUMNS = ("fault", "calls", "arrivals", "429s", "duplicates", "in flight at the fault",
           "effective duplicates", "time to recover", "job time", "result")  # fmt: skip


def render(rows: Sequence[Row], about: str) -> str:
    """The table, then the problems and notes of each row, then `about`."""

    def cells(row: Row) -> list[str]:
        if row.skipped is not None:
            return [row.fault, *[""] * (len(COLUMNS) - 2), f"skipped: {row.skipped}"]
        effective = "n/a" if row.effective is None else f"{row.effective:,}"
        return [row.fault, f"{row.calls:,}", _n(row.arrivals), f"{row.throttled:,}",
                _n(row.duplicates), _n(row.in_flight), effective, _s(row.recover),
                _s(row.job_seconds), row.result]  # fmt: skip

    table = [COLUMNS, ("---", *["--:"] * (len(COLUMNS) - 2), "---"), *map(cells, rows)]
    lines = ["| " + " | ".join(line) + " |" for line in table]
    lines += [""] + [f"- {row.fault}: {text}" for row in rows for text in row.problems + row.notes]
    return "\n".join([*lines, "", about])


def _n(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def _s(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


def record(table: str) -> None:
    text = DOC.read_text()
    begin, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if begin < 0 or end < begin:
        raise ChaosError(f"{DOC} has no place for the table (its marker lines)")
    DOC.write_text(f"{text[: begin + len(DOC_BEGIN)]}\n{table}\n{text[end:]}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m faults.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help="calls per job")
    parser.add_argument(
        "--only", default=",".join(FAULTS), help=f"faults to run, of: {', '.join(FAULTS)}"
    )
    parser.add_argument("--record", action="store_true", help=f"write the table into {DOC.name}")
    parser.add_argument(
        "--no-postgres", action="store_true", help="SQLite, as where PostgreSQL is not installed"
    )
    args = parser.parse_args(argv)
    args.faults = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in args.faults if name not in FAULTS]
    if unknown or not args.faults:
        parser.error(f"--only: unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    if args.calls < 20:
        parser.error("--calls must be at least 20")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    rows: list[Row] = []
    try:
        about = run(args, rows)
    except ChaosError as exc:
        _progress(f"stopped: {exc}")
        print(render(rows, "The suite stopped before its end."))
        return 2
    table = render(rows, about)
    total = time.monotonic() - began
    table += f" Total time of the run: {total:.0f} s."
    print(table)
    if args.record:
        record(table)
    failed = sum(row.result == "**FAIL**" for row in rows)
    skipped = sum(row.skipped is not None for row in rows)
    if skipped and ci_requires_every_check():
        # as for the tests: CI cannot go green by skipping a row
        _progress(f"CI={os.environ['CI']}: {skipped} skipped rows count as failed")
        failed, skipped = failed + skipped, 0
    print(f"chaos: {len(rows) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def run(args: argparse.Namespace, rows: list[Row]) -> str:
    """Start everything, run the rows into `rows`, stop everything; returns the footnote."""
    with contextlib.ExitStack() as cleanup:
        tmp = Path(tempfile.mkdtemp(prefix="ratejobs-chaos-"))
        cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
        postgres = None if args.no_postgres else _start_postgres(cleanup)
        logs = [tmp] if postgres is None else [tmp, postgres.root]
        cleanup.callback(_keep_logs_if_failed, rows, logs)
        broker = PrivateRedis(tmp / "redis")
        broker.start()
        cleanup.callback(broker.stop)
        os.environ.update(CHAOS_SETTINGS, REDIS_URL=broker.url)
        os.environ.pop("CELERY_BROKER_URL", None)
        if postgres is not None:
            os.environ["DATABASE_URL"] = postgres.url
        else:  # bench_setup then takes a SQLite file of its own
            os.environ.pop("DATABASE_URL", None)
        setup = cleanup.enter_context(bench_setup())
        from ratejobs.services.apis import api_create
        from sandbox.process import start_sandbox_process

        sandbox = start_sandbox_process(rate=API_RATE, burst=SANDBOX_BURST, headers="none")
        cleanup.callback(sandbox.stop)
        api = api_create(
            name=f"chaos-{uuid.uuid4().hex[:8]}", base_url=sandbox.url, rate=API_RATE,
            period=1.0, burst=API_BURST, idempotency_header=IDEMPOTENCY_HEADER,
        )  # fmt: skip
        rig = _start_processes(setup, tmp, postgres, broker, sandbox, api, cleanup)
        for name in args.faults:
            rows.append(run_row(rig, FAULTS[name], args.calls))
            row = rows[-1]
            _progress(f"{name}: {row.result}" + "".join(f"; {p}" for p in row.problems))
        database = "PostgreSQL (initdb, private)" if postgres else "SQLite (no PostgreSQL)"
        command = f"python -m faults.chaos --calls {args.calls} --only {','.join(args.faults)}"
        command += " --no-postgres" if args.no_postgres else ""
        return (
            f"Command: `{command}`; {date_now()}. One job of {args.calls:,} GETs per fault; "
            f"API at {API_RATE:g}/s "
            f"(burst {API_BURST}) with {IDEMPOTENCY_HEADER}, sandbox enforcing {API_RATE:g}/s "
            f"(burst {SANDBOX_BURST}); {WORKERS} × `celery -A project worker -c "
            f"{WORKER_CONCURRENCY}` and beat; {database}; settings "
            + ", ".join(f"{k}={v}" for k, v in CHAOS_SETTINGS.items())
            + f"; {setup.about}"
        )


def _start_postgres(cleanup: contextlib.ExitStack) -> PrivatePostgres | None:
    bindir = postgres_bindir()
    if bindir is None:
        _progress("no PostgreSQL binaries (initdb, pg_ctl): SQLite, postgres-restart skipped")
        return None
    # A directory of its own: as root, the postgres user owns it, and may not enter ours.
    root = Path(tempfile.mkdtemp(prefix="ratejobs-chaos-pg-"))
    cleanup.callback(shutil.rmtree, root, ignore_errors=True)
    postgres = PrivatePostgres(bindir, root)
    postgres.start()
    cleanup.callback(postgres.stop)
    _progress(f"PostgreSQL of our own at {postgres.url} ({bindir})")
    return postgres


def _start_processes(
    setup: Setup, tmp: Path, postgres: PrivatePostgres | None, broker: PrivateRedis,
    sandbox: Any, api: Any, cleanup: contextlib.ExitStack,
) -> Rig:  # fmt: skip
    """The workers and beat, started side by side (each takes seconds to import Django)."""
    rig = Rig(setup, tmp, postgres, broker, sandbox, api, workers=[], beat=None)
    cleanup.callback(_stop_processes, rig)
    with ThreadPoolExecutor() as pool:
        workers = [pool.submit(rig.new_worker) for _ in range(WORKERS)]
        beat = pool.submit(Beat, setup.env, tmp)
    for future in workers:
        with contextlib.suppress(Exception):
            rig.workers.append(future.result())
    with contextlib.suppress(Exception):
        rig.beat = beat.result()
    for future in [*workers, beat]:
        future.result()  # the first error, now that every process started is known
    supervisor = threading.Thread(target=rig.supervise, name="chaos-supervisor", daemon=True)
    supervisor.start()
    cleanup.callback(supervisor.join)
    cleanup.callback(rig.stopping.set)
    return rig


def _stop_processes(rig: Rig) -> None:
    if rig.beat is not None:
        rig.beat.stop()
    for worker in rig.workers:
        worker.stop()
    for worker in rig.killed:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.process.pid, signal.SIGKILL)


def _keep_logs_if_failed(rows: Sequence[Row], directories: Sequence[Path]) -> None:
    if all(row.result != "**FAIL**" for row in rows):
        return
    shutil.rmtree(FAILED_LOGS, ignore_errors=True)
    FAILED_LOGS.mkdir(parents=True)
    for log in [log for d in directories for log in [*d.glob("*.log"), *d.glob("*/*.log")]]:
        with contextlib.suppress(OSError):
            shutil.copy(log, FAILED_LOGS / log.name)
    _progress(f"logs of the failed run kept in {FAILED_LOGS.relative_to(PROJECT_ROOT)}/")


def date_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _progress(message: str) -> None:
    print(f"[chaos] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
