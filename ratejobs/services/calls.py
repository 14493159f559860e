"""Running one call: claim it, send it through the shared limiter, record the outcome once."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from ratejobs.credentials import CredentialError, resolve_credential
from ratejobs.dispatch import request_dispatch
from ratejobs.execution.execute import ExecutionPolicy, Outcome, execute_call
from ratejobs.execution.http import session_for_process
from ratejobs.execution.outbound import policy_for
from ratejobs.execution.request import HttpRequest, build_request
from ratejobs.models import Api, Call, Job, ThrottleEvent
from ratejobs.services.apis import api_limiter
from ratejobs.services.jobs import job_complete_if_done, job_lock

logger = logging.getLogger(__name__)

# A claimed call belongs to its task for the longest an attempt can take plus this margin;
# after that the task is presumed dead and a redelivered message may take the call over.
CLAIM_MARGIN_SECONDS = 60.0


PROCESS_OWNER_HOST = socket.gethostname()


def _owner() -> str:
    return f"{PROCESS_OWNER_HOST}:{os.getpid()}"


def _take_over_from_dead_process(call_id: int, token: str, now, hold: float) -> bool:
    """A call left running by a process of this host that no longer exists (a pool child
    killed with -9, whose message Celery redelivers at once) is taken over without waiting
    for its claim to expire. Other hosts' claims can only expire."""
    row = (
        Call.objects.filter(pk=call_id, status=Call.Status.RUNNING, job__status__in=Job.ACTIVE)
        .values_list("claim_token", "claim_owner")
        .first()
    )
    if row is None:
        return False
    old_token, owner = row
    if not claim_owner_is_dead(owner):
        return False
    return bool(
        Call.objects.filter(pk=call_id, status=Call.Status.RUNNING, claim_token=old_token).update(
            claim_token=token,
            claim_owner=_owner(),
            running_until=now + timedelta(seconds=hold),
        )
    )


def claim_owner_is_dead(owner: str) -> bool:
    """Whether `owner` (host:pid) is a process of this host that no longer exists; a process
    of another host cannot be checked from here, so it counts as alive."""
    host, _, pid = owner.rpartition(":")
    if host != PROCESS_OWNER_HOST or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # exists, owned by someone else
    return False


def execution_policy(api: Api) -> ExecutionPolicy:
    return ExecutionPolicy(
        read_timeout=api.timeout,
        max_body_bytes=settings.RATEJOBS_MAX_RESPONSE_BYTES,
        max_attempts=api.max_attempts,
        max_throttled_retries=api.max_throttled_retries,
    )


def call_request(call: Call, api: Api) -> HttpRequest:
    secret = resolve_credential(
        credential_env=api.credential_env, credential_encrypted=api.credential_encrypted
    )
    extra = {"json": call.json} if call.json is not None else {}
    return build_request(
        method=call.method,
        base_url=api.base_url,
        path=call.path,
        query=call.query,
        headers={**api.default_headers, **(call.headers or {})},
        body=call.body,
        credentials={api.auth_header: secret} if secret else None,
        **extra,
    )


def call_execute(*, call_id: int) -> str:
    """Run one attempt of a call if it is still wanted; safe to run twice for one message."""
    call = Call.objects.select_related("job__api").filter(pk=call_id).first()
    if call is None:
        return "missing"
    api = call.job.api
    policy = execution_policy(api)
    token = uuid.uuid4().hex
    now = timezone.now()
    hold = settings.RATEJOBS_MAX_WORKER_WAIT + policy.lease_seconds + CLAIM_MARGIN_SECONDS
    # The job's status is read through a subquery, not a join: on PostgreSQL an UPDATE with a
    # join becomes `WHERE id IN (SELECT ...)`, which after waiting on a concurrent cancel
    # re-checks nothing and would claim a call that was just cancelled. Conditions on the
    # call's own row are re-checked after the wait, and cancel and pause both change that row.
    claimed = (
        Call.objects.filter(
            pk=call_id,
            job_id__in=Job.objects.filter(status__in=Job.ACTIVE).values("pk"),
            dispatched_at__isnull=False,
        )
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .filter(
            Q(status=Call.Status.PENDING)
            | Q(status=Call.Status.RUNNING, running_until__lt=now)  # its worker died
        )
        .update(
            status=Call.Status.RUNNING,
            claim_token=token,
            running_until=now + timedelta(seconds=hold),
            claim_owner=_owner(),
            started=Coalesce(F("started"), now),
        )
    )
    if not claimed and not _take_over_from_dead_process(call_id, token, now, hold):
        return "skipped"  # final, cancelled, paused, not due, or another task has it
    try:
        request = call_request(call, api)
    except (CredentialError, ValueError) as exc:
        _finish_unsendable(call, token, str(exc))
        return "failed"
    outcome = execute_call(
        request,
        limiter=api_limiter(api),
        session=session_for_process(policy_for(settings.RATEJOBS_OUTBOUND_ALLOW)),
        policy=policy,
        attempts=call.attempts + 1,
        throttled_retries=call.throttled_count,
        max_wait=settings.RATEJOBS_MAX_WORKER_WAIT,
    )
    call_record_outcome(call=call, token=token, outcome=outcome)
    return outcome.kind


@transaction.atomic
def call_record_outcome(*, call: Call, token: str, outcome: Outcome) -> bool:
    """Write an attempt's outcome, once: only the task holding the claim may write it."""
    now = timezone.now()
    # Lock the job first, as job_cancel does: a cancel cannot slip between this check and the
    # write below, so an attempt that ends in a retry never leaves a pending call behind in a
    # cancelled job.
    job_status = job_lock(call.job_id)
    kind = outcome.kind
    if kind not in ("succeeded", "failed") and job_status == Job.Status.CANCELLED:
        kind = "cancelled"
    final = kind in ("succeeded", "failed", "cancelled")
    fields: dict = {
        "claim_token": "",
        "claim_owner": "",
        "running_until": None,
        "dispatched_at": None,
        "attempts": outcome.attempts,
        "throttled_count": outcome.throttled_retries,
        "error": outcome.error,
    }
    result = outcome.result
    if result is not None:
        fields.update(
            status_code=result.status_code,
            response_headers=result.headers,
            response_body=result.body,
            response_truncated=result.truncated,
            duration=result.duration,
        )
    if final:
        fields.update(status=kind, finished=now, next_attempt_at=None)
    else:
        fields.update(
            status=Call.Status.PENDING,
            next_attempt_at=now + timedelta(seconds=outcome.retry_after),
        )
    if not Call.objects.filter(pk=call.pk, status=Call.Status.RUNNING, claim_token=token).update(
        **fields
    ):
        return False  # presumed dead and taken over by another task: its result counts
    counters: dict = {}
    if final:
        counters[kind] = F(kind) + 1
    if kind in ("retry", "throttled"):
        counters["retries"] = F("retries") + 1
    if outcome.decision.throttle:
        counters["throttled"] = F("throttled") + 1
    if counters:
        Job.objects.filter(pk=call.job_id).update(**counters)
    _record_throttle_events(call, outcome)
    if final:
        job_complete_if_done(job_id=call.job_id)
    api_id = call.job.api_id
    transaction.on_commit(lambda: request_dispatch(api_id))
    return True


def _finish_unsendable(call: Call, token: str, error: str) -> None:
    with transaction.atomic():
        job_lock(call.job_id)
        updated = Call.objects.filter(
            pk=call.pk, status=Call.Status.RUNNING, claim_token=token
        ).update(
            status=Call.Status.FAILED,
            error=error,
            finished=timezone.now(),
            claim_token="",
            claim_owner="",
            running_until=None,
            dispatched_at=None,
        )
        if updated:
            Job.objects.filter(pk=call.job_id).update(failed=F("failed") + 1)
            job_complete_if_done(job_id=call.job_id)
    request_dispatch(call.job.api_id)


def _record_throttle_events(call: Call, outcome: Outcome) -> None:
    feedback, result = outcome.feedback, outcome.result
    if result is None or feedback is None:
        return
    common = {"api_id": call.job.api_id, "job_id": call.job_id, "call_id": call.pk}
    events = []
    if outcome.decision.throttle:
        events.append(
            ThrottleEvent(
                kind=ThrottleEvent.Kind.THROTTLED,
                status_code=result.status_code,
                retry_after=feedback.blocked_for or None,
                rate_before=feedback.rate_before,
                rate_after=feedback.rate_after,
                **common,
            )
        )
    elif feedback.blocked_for:
        events.append(
            ThrottleEvent(
                kind=ThrottleEvent.Kind.QUOTA_EXHAUSTED,
                status_code=result.status_code,
                retry_after=feedback.blocked_for,
                **common,
            )
        )
    if feedback.rate_decreased:
        events.append(
            ThrottleEvent(
                kind=ThrottleEvent.Kind.RATE_DECREASED,
                rate_before=feedback.rate_before,
                rate_after=feedback.rate_after,
                **common,
            )
        )
    ThrottleEvent.objects.bulk_create(events)
    if events:
        _log_throttle_decision(call, outcome, [str(event.kind) for event in events])


def _log_throttle_decision(call: Call, outcome: Outcome, kinds: list[str]) -> None:
    """One INFO line per response that changed the shared limiter: what the API said and what
    every worker now does about it."""
    feedback, result = outcome.feedback, outcome.result
    fields = {
        "api": call.job.api.name,
        "job_id": call.job_id,
        "call_id": call.pk,
        "status_code": result.status_code,
        "events": ",".join(kinds),
        "blocked_for": round(feedback.blocked_for, 3),
        "rate_before": round(feedback.rate_before, 3),
        "rate_after": round(feedback.rate_after, 3),
        "outcome": outcome.kind,
        "retry_in": round(outcome.retry_after, 3),
    }
    logger.info(
        "throttle decision: api=%(api)s job=%(job_id)s call=%(call_id)s status=%(status_code)s "
        "events=%(events)s blocked_for=%(blocked_for).3fs rate=%(rate_before).3f->"
        "%(rate_after).3f outcome=%(outcome)s retry_in=%(retry_in).3fs",
        fields,
        extra=fields,
    )
