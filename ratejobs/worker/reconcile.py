"""The safety net: calls whose broker message or worker was lost go back to the dispatcher,
jobs whose calls are all final are finished, and every API's window is topped up.

Workers run the part that needs no beat themselves (calls_recover_orphans, from each process's
recorder thread), so a worker killed with -9 loses nothing even where beat does not run."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db.models import Q, QuerySet

from ratejobs.infra.clock import database_now
from ratejobs.infra.connections import connect_redis, redis_client
from ratejobs.infra.heartbeats import owner_is_dead, workers_forget_long_gone
from ratejobs.infra.wakeups import request_dispatch, schedule_wakeup
from ratejobs.models import Call, Job
from ratejobs.namespace import redis_key
from ratejobs.services.callbacks import callbacks_requeue
from ratejobs.services.jobs import (
    job_cancel_leftovers,
    job_complete_if_done,
    jobs_cancel_past_deadline,
)
from ratejobs.worker.dispatch import dispatch_api

logger = logging.getLogger(__name__)

# Kept in the broker's Redis by the reconciler: that server's run_id when it last looked. Gone
# or different, the broker restarted (empty, or from an older snapshot) and the messages sent
# since are lost, so their calls are dispatched again at once instead of after
# RATEJOBS_STALE_DISPATCH_SECONDS. Under the deployment's namespace (redis_key): deployments
# sharing a broker server each keep their own.
BROKER_RUN_ID_KEY = "broker-run-id"


@dataclass(frozen=True)
class ReconcileResult:
    redispatched: int  # in the broker too long: their message was lost
    recovered: int  # running on a worker that died
    cancelled: int  # recovered, but their job had been cancelled meanwhile
    completed_jobs: int
    apis: int


def calls_recover_orphans(now: datetime | None = None) -> int:
    """Give back to the dispatcher calls running on a process that died (its claim expired, or
    the process sent no heartbeat for RATEJOBS_WORKER_DEAD_AFTER seconds), and calls a worker
    process put in the broker's window and then died: it may have died between marking them
    and sending their messages (found by a kill -9 test: 3 calls of 60 waited for the
    reconciler). Were the messages sent, they find their calls given back, or claim them once
    before a second message would."""
    now = now or database_now()
    dead = owner_is_dead(now)
    running = Call.objects.filter(Q(running_until__lt=now) | dead, status=Call.Status.RUNNING)
    # two statements, each on its own partial index (call_running_owner, call_in_window)
    in_window = Call.objects.filter(
        dead, status=Call.Status.PENDING, dispatched_at__isnull=False
    ).exclude(claim_owner="")
    return _give_back(running) + _give_back(in_window)


def calls_release_claim(*, token: str, call_ids: list[int]) -> int:
    """Give back to the dispatcher the calls a claim took when it failed part way, before any
    of them was started (the database went away after the claiming UPDATE, or its answer was
    lost): held by a live process, they would otherwise wait out the claim (minutes)."""
    return _give_back(
        Call.objects.filter(pk__in=call_ids, claim_token=token, status=Call.Status.RUNNING)
    )


def _give_back(calls: QuerySet[Call]) -> int:
    api_ids = set(calls.values_list("job__api_id", flat=True).distinct())
    if not api_ids:
        return 0
    # Locks only the call rows, one statement: pause and cancel lock the job first and then
    # its calls, so nothing here waits on a job while holding a call.
    given_back = calls.update(
        status=Call.Status.PENDING,
        dispatched_at=None,
        claim_token="",
        claim_owner="",
        running_until=None,
    )
    for api_id in api_ids:
        request_dispatch(api_id)
    return given_back


def broker_restarted() -> bool:
    """Whether the broker's Redis restarted since this was last asked (the first time: yes).
    A restart that kept everything says yes too: dispatching again costs messages, never a
    second send, since a call is claimed once."""
    client = _broker_client()
    if client is None:
        return False
    try:
        run_id = client.info("server")["run_id"]
        seen = client.getset(redis_key(BROKER_RUN_ID_KEY), run_id)
    except redis.RedisError as exc:
        logger.warning("reconciler: cannot ask the broker whether it restarted: %s", exc)
        return False
    return seen not in (run_id, run_id.encode())


def _broker_client() -> redis.Redis | None:
    """The broker's Redis, where one client can ask it (not a Cluster: no broker runs there)."""
    url = settings.CELERY_BROKER_URL
    if url == settings.REDIS_URL and not settings.REDIS_CLUSTER:
        return redis_client()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return _broker_redis(url)
    return None


@functools.cache
def _broker_redis(url: str) -> redis.Redis:
    return connect_redis(url, sentinels=[], sentinel_master="", cluster=False)


def reconcile() -> ReconcileResult:
    """Run by celery beat every RATEJOBS_RECONCILE_INTERVAL seconds."""
    now = database_now()
    lost = broker_restarted()
    stale = now if lost else now - timedelta(seconds=settings.RATEJOBS_STALE_DISPATCH_SECONDS)
    redispatched = Call.objects.filter(status=Call.Status.PENDING, dispatched_at__lt=stale).update(
        dispatched_at=None
    )
    recovered = calls_recover_orphans(now)
    leftovers = job_cancel_leftovers() + jobs_cancel_past_deadline()
    # One job or API that cannot be handled (a row no check caught, a bug) is logged with its
    # id and skipped: it must not stop the others' completion and dispatch every run.
    completed = 0
    for job_id in Job.objects.filter(status=Job.Status.RUNNING).values_list("pk", flat=True):
        try:
            completed += job_complete_if_done(job_id=job_id)
        except Exception:
            logger.exception("reconciler: could not check job %s; going on with the others", job_id)
    workers_forget_long_gone(now)
    try:  # job callbacks whose sender died or whose message was lost
        callbacks_requeue()
    except Exception:
        logger.exception("reconciler: could not requeue job callbacks; going on")
    api_ids = set(
        Job.objects.filter(status__in=Job.ACTIVE).values_list("api_id", flat=True).distinct()
    )
    for api_id in sorted(api_ids):
        try:
            schedule_wakeup(api_id, dispatch_api(api_id=api_id).next_due)
        except Exception:
            logger.exception(
                "reconciler: could not dispatch API %s; going on with the others", api_id
            )
    if redispatched or recovered or leftovers:
        logger.info(
            "reconciler: %d calls re-dispatched%s, %d recovered from dead workers, "
            "%d left in cancelled jobs cancelled",
            redispatched,
            " (the broker restarted: its messages were lost)" if lost else "",
            recovered,
            leftovers,
        )
    return ReconcileResult(redispatched, recovered, leftovers, completed, len(api_ids))
