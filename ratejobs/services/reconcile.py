"""The safety net: calls whose broker message or worker was lost go back to the dispatcher,
jobs whose calls are all final are finished, and every API's window is topped up.

Workers run the part that needs no beat themselves (calls_recover_orphans, from each process's
recorder thread), so a worker killed with -9 loses nothing even where beat does not run."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from ratejobs.models import Call, Job
from ratejobs.services.dispatch import dispatch_api, request_dispatch, schedule_wakeup
from ratejobs.services.jobs import job_cancel_leftovers, job_complete_if_done
from ratejobs.services.workers import database_now, owner_is_dead, workers_forget_long_gone

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReconcileResult:
    redispatched: int  # in the broker too long: their message was lost
    recovered: int  # running on a worker that died
    cancelled: int  # recovered, but their job had been cancelled meanwhile
    completed_jobs: int
    apis: int


def calls_recover_orphans(now: datetime | None = None) -> int:
    """Give back to the dispatcher calls running on a process that died: its claim expired, or
    the process sent no heartbeat for RATEJOBS_WORKER_DEAD_AFTER seconds."""
    now = now or database_now()
    orphans = Call.objects.filter(
        Q(running_until__lt=now) | owner_is_dead(now), status=Call.Status.RUNNING
    )
    api_ids = set(orphans.values_list("job__api_id", flat=True).distinct())
    if not api_ids:
        return 0
    # Locks only the call rows, one statement: pause and cancel lock the job first and then
    # its calls, so nothing here waits on a job while holding a call.
    recovered = orphans.update(
        status=Call.Status.PENDING,
        dispatched_at=None,
        claim_token="",
        claim_owner="",
        running_until=None,
    )
    for api_id in api_ids:
        request_dispatch(api_id)
    return recovered


def reconcile() -> ReconcileResult:
    """Run by celery beat every RATEJOBS_RECONCILE_INTERVAL seconds."""
    now = database_now()
    stale = now - timedelta(seconds=settings.RATEJOBS_STALE_DISPATCH_SECONDS)
    redispatched = Call.objects.filter(status=Call.Status.PENDING, dispatched_at__lt=stale).update(
        dispatched_at=None
    )
    recovered = calls_recover_orphans(now)
    leftovers = job_cancel_leftovers()
    # One job or API that cannot be handled (a row no check caught, a bug) is logged with its
    # id and skipped: it must not stop the others' completion and dispatch every run.
    completed = 0
    for job_id in Job.objects.filter(status=Job.Status.RUNNING).values_list("pk", flat=True):
        try:
            completed += job_complete_if_done(job_id=job_id)
        except Exception:
            logger.exception("reconciler: could not check job %s; going on with the others", job_id)
    workers_forget_long_gone(now)
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
            "reconciler: %d calls re-dispatched, %d recovered from dead workers, "
            "%d left in cancelled jobs cancelled",
            redispatched,
            recovered,
            leftovers,
        )
    return ReconcileResult(redispatched, recovered, leftovers, completed, len(api_ids))
