"""Celery tasks: thin, each loads nothing itself and calls one service.

Arguments are ids only (never secrets); a message of calls carries its job's id so Flower
shows which job it belongs to and, in its argsrepr, how many calls it carries.
"""

from __future__ import annotations

from celery import shared_task

from ratejobs.services import dispatch as dispatching
from ratejobs.services import reconcile as reconciling
from ratejobs.services.engine import calls_start


@shared_task(name=dispatching.EXECUTE_CALLS_TASK, acks_late=True, reject_on_worker_lost=True)
def execute_calls(job_id: int, call_ids: list[int]) -> int:
    return calls_start(job_id=job_id, call_ids=call_ids)


@shared_task(name=dispatching.DISPATCH_TASK, acks_late=True)
def dispatch(api_id: int) -> int:
    result = dispatching.dispatch_api(api_id=api_id)
    dispatching.schedule_wakeup(api_id, result.next_due)
    return result.dispatched


@shared_task(name="ratejobs.reconcile")
def reconcile() -> dict[str, int]:
    result = reconciling.reconcile()
    return {
        "redispatched": result.redispatched,
        "recovered": result.recovered,
        "cancelled": result.cancelled,
        "completed_jobs": result.completed_jobs,
        "apis": result.apis,
    }
