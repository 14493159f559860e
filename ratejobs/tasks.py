"""Celery tasks: thin, each loads nothing itself and calls one service.

Arguments are ids only (never secrets); a message of calls carries its job's id so Flower
shows which job it belongs to and, in its argsrepr, how many calls it carries.
"""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from ratejobs.celery_settings import (
    CALLBACK_TASK,
    DISPATCH_TASK,
    EXECUTE_CALLS_TASK,
    PURGE_TASK,
    RECONCILE_TASK,
    RETENTION_TASK,
)
from ratejobs.infra import wakeups
from ratejobs.services import callbacks, retention
from ratejobs.worker import dispatch as dispatching
from ratejobs.worker import reconcile as reconciling
from ratejobs.worker.engine import calls_start, heartbeating_owner

# A task that meets a database error (a restart, a pooler's) runs again after 1, 2, 4, 8, 8 and
# 8 s: both tasks below are safe to run twice.
RETRY_ON_DATABASE_ERRORS = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": 1,
    "retry_backoff_max": 8,
    "retry_jitter": False,
    "max_retries": 6,
}


# A database restart fails the claim; a message acknowledged as failed would leave its calls in
# the window until RATEJOBS_STALE_DISPATCH_SECONDS (minutes), so it is retried instead. Claims
# make the second run safe: calls it finds taken are skipped.
@shared_task(
    name=EXECUTE_CALLS_TASK, acks_late=True, reject_on_worker_lost=True, **RETRY_ON_DATABASE_ERRORS
)
def execute_calls(job_id: int, call_ids: list[int]) -> int:
    return calls_start(job_id=job_id, call_ids=call_ids)


# Two runs of one message (a redelivery) are harmless: the delivery is claimed before it is sent.
@shared_task(name=CALLBACK_TASK, acks_late=True)
def job_callback(job_id: int) -> str:
    return callbacks.job_callback_send(job_id=job_id)


# Retried on a database error as execute_calls is: a run that failed schedules no wake-up, and
# an API waiting only on one (not_before, a Retry-After) waited for the reconciler (a
# PgBouncer restart in make scale failed 2 runs of 4). A second run is harmless.
@shared_task(name=DISPATCH_TASK, acks_late=True, **RETRY_ON_DATABASE_ERRORS)
def dispatch(api_id: int) -> int:
    result = dispatching.dispatch_api(api_id=api_id, dispatcher=heartbeating_owner())
    wakeups.schedule_wakeup(api_id, result.next_due)
    return result.dispatched


@shared_task(name=RECONCILE_TASK)
def reconcile() -> dict[str, int]:
    result = reconciling.reconcile()
    return {
        "redispatched": result.redispatched,
        "recovered": result.recovered,
        "cancelled": result.cancelled,
        "completed_jobs": result.completed_jobs,
        "apis": result.apis,
    }


@shared_task(name=RETENTION_TASK)
def retention_run() -> dict[str, int]:
    result = retention.retention_run()
    return {
        "purged_rows": result.purged.rows,
        "events": result.events.rows,
        "bodies": result.bodies.rows,
    }


@shared_task(name=PURGE_TASK)
def purge_jobs() -> int:
    return retention.purge_run().rows
