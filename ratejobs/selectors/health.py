"""Whether this deployment can do its work: the database, the limiter's Redis, the broker and
the workers, each checked within a bounded time (for /healthz)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection

from ratejobs.infra.clock import database_now
from ratejobs.infra.connections import connect_redis
from ratejobs.models import WorkerProcess
from ratejobs.namespace import limiter_namespace

OK, DEGRADED, DOWN = "ok", "degraded", "down"
# A Redis that does not answer a PING within this long counts as down: a health check must
# answer before the prober's own timeout (docker-compose gives it 10 s), and a healthy Redis
# answers in a millisecond.
REDIS_CHECK_TIMEOUT = 1.0
# A worker process heartbeats every RATEJOBS_WORKER_HEARTBEAT_SECONDS (5 s): one not seen for a
# minute is gone, not late.
WORKERS_SEEN_SECONDS = 60


@dataclass(frozen=True)
class PartHealth:
    status: str  # OK or DOWN
    required: bool  # DOWN here makes the whole deployment DOWN (503), else DEGRADED
    ms: float | None = None  # how long the check took, milliseconds
    error: str = ""  # why it is DOWN
    seen_last_minute: int | None = None  # workers only
    same_as: str = ""  # the broker when it is the limiter's Redis: checked once, there

    def as_json(self, *, errors: bool = True) -> dict[str, Any]:
        fields = {"status": self.status, "required": self.required, "ms": self.ms}
        fields |= {"error": self.error if errors else "", "seen_last_minute": self.seen_last_minute}
        fields["same_as"] = self.same_as
        return {name: value for name, value in fields.items() if value not in (None, "")}


@dataclass(frozen=True)
class HealthReport:
    namespace: str  # RATEJOBS_NAMESPACE
    limiter_namespace: str  # the limiters' (shared with another deployment when it differs)
    checks: dict[str, PartHealth]

    @property
    def status(self) -> str:
        """DOWN when a required part is down, DEGRADED when another one is, else OK."""
        down = [part for part in self.checks.values() if part.status != OK]
        if any(part.required for part in down):
            return DOWN
        return DEGRADED if down else OK

    def as_json(self, *, errors: bool = True) -> dict[str, Any]:
        """errors=False leaves out why a part is down (a driver's message names internal hosts
        and ports): a prober needs only the statuses."""
        shared = (
            {}
            if self.limiter_namespace == self.namespace
            else {"limiter_namespace": self.limiter_namespace}
        )
        return {
            "status": self.status,
            "namespace": self.namespace,
            **shared,
            "checks": {name: part.as_json(errors=errors) for name, part in self.checks.items()},
        }


def _timed(check: Callable[[], Any], *, required: bool) -> tuple[PartHealth, Any]:
    """Run `check`: OK with its duration and its result, or DOWN naming the error."""
    started = time.perf_counter()
    try:
        result = check()
    except Exception as exc:  # any driver or network error means the same thing here
        ms = round((time.perf_counter() - started) * 1000, 1)
        return PartHealth(DOWN, required, ms=ms, error=_error_text(exc)), None
    return PartHealth(OK, required, ms=round((time.perf_counter() - started) * 1000, 1)), result


def _error_text(exc: Exception) -> str:
    # The type and the driver's first line: enough to tell refused from timed out, and no
    # URL with a password in it (redis-py and psycopg name the host and port only).
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first_line}"[:200]


def _database() -> PartHealth:
    def select_one() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    return _timed(select_one, required=True)[0]


@functools.lru_cache(maxsize=4)
def _health_redis(url: str, sentinels: tuple[str, ...], master: str, cluster: bool) -> Any:
    """A client of its own with a short timeout (the services' waits 5 s), kept per process."""
    return connect_redis(
        url,
        sentinels=list(sentinels),
        sentinel_master=master,
        cluster=cluster,
        timeout=REDIS_CHECK_TIMEOUT,
    )


def _limiter_redis() -> PartHealth:
    client = _health_redis(
        settings.REDIS_URL,
        tuple(settings.REDIS_SENTINELS),
        settings.REDIS_SENTINEL_MASTER,
        settings.REDIS_CLUSTER,
    )
    return _timed(client.ping, required=True)[0]


def _broker(limiter_redis: PartHealth) -> PartHealth:
    url = settings.CELERY_BROKER_URL
    if url == settings.REDIS_URL and not settings.REDIS_CLUSTER:
        return PartHealth(limiter_redis.status, True, error=limiter_redis.error, same_as="redis")
    if url.startswith(("redis://", "rediss://", "unix://")):
        client = _health_redis(url, (), "", False)
        return _timed(client.ping, required=True)[0]

    def connect() -> None:  # another transport (sentinel://, amqp://): ask kombu
        from celery import current_app

        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=0, timeout=REDIS_CHECK_TIMEOUT)

    return _timed(connect, required=True)[0]


def _workers(database: PartHealth) -> PartHealth:
    required = settings.RATEJOBS_HEALTH_REQUIRE_WORKERS
    if database.status != OK:
        return PartHealth(DOWN, required, error="unknown: the database is down")

    def seen() -> int:
        since = database_now() - timedelta(seconds=WORKERS_SEEN_SECONDS)
        return WorkerProcess.objects.filter(seen_at__gte=since).count()

    part, count = _timed(seen, required=required)
    if part.status != OK:
        return part
    if not count:
        return PartHealth(
            DOWN,
            required,
            ms=part.ms,
            error=f"no worker process seen in the last {WORKERS_SEEN_SECONDS} s",
            seen_last_minute=0,
        )
    return PartHealth(OK, required, ms=part.ms, seen_last_minute=count)


def deployment_health() -> HealthReport:
    """Each part's state now. Required: the database (the truth) and Redis, the limiter's and
    the broker (nothing is dispatched without them); the workers only with
    RATEJOBS_HEALTH_REQUIRE_WORKERS, since a web process must not be restarted because the
    workers are gone."""
    database = _database()
    limiter_redis = _limiter_redis()
    return HealthReport(
        namespace=settings.RATEJOBS_NAMESPACE,
        limiter_namespace=limiter_namespace(),
        checks={
            "database": database,
            "redis": limiter_redis,
            "broker": _broker(limiter_redis),
            "workers": _workers(database),
        },
    )
