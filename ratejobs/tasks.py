"""Celery tasks: thin, each loads nothing itself and calls one service.

Arguments are ids only (never secrets); call tasks carry the job id too so Flower shows which
job a call belongs to.
"""

from __future__ import annotations

from celery import shared_task

from ratejobs import dispatch as dispatching
from ratejobs.services.calls import call_execute


@shared_task(name="ratejobs.execute_call", acks_late=True, reject_on_worker_lost=True)
def execute_call(call_id: int, job_id: int) -> str:
    return call_execute(call_id=call_id)


@shared_task(name="ratejobs.dispatch", acks_late=True)
def dispatch(api_id: int) -> int:
    result = dispatching.dispatch_api(api_id=api_id)
    dispatching.schedule_wakeup(api_id, result.next_due)
    return result.dispatched


@shared_task(name="ratejobs.reconcile")
def reconcile() -> dict[str, int]:
    result = dispatching.reconcile()
    return {
        "redispatched": result.redispatched,
        "recovered": result.recovered,
        "cancelled": result.cancelled,
        "completed_jobs": result.completed_jobs,
        "apis": result.apis,
    }
