"""Job callbacks: when a job finishes, POST its summary to the job's callback_url, signed with
its owner's SigningKey (ratejobs.signing), retried with backoff, through the same outbound
policy and HTTP path as the API calls. Also the signing keys themselves.

Each finish of a job is one delivery (a new `callback_delivery` id, the same on every attempt).
A worker claims the delivery with a conditional UPDATE before sending, so two workers never
send it at once, and records the attempt only while its claim is still the current one. A
worker killed mid-send leaves a claim that expires, and the reconciler gives the delivery back:
that attempt may reach the receiver twice, with the same X-Ratejobs-Delivery id.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from celery import current_app
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Case, Count, F, Q, Value, When
from django.db.models import UUIDField as UUIDModelField
from django.urls import reverse
from django.utils import timezone

from ratejobs.credentials import CredentialError, decrypt_secret, encrypt_secret
from ratejobs.execution.backoff import backoff_ceiling, full_jitter
from ratejobs.execution.http import HttpResult, send, session_for_process
from ratejobs.execution.outbound import policy_for
from ratejobs.execution.request import HttpRequest
from ratejobs.headers import parse_retry_after
from ratejobs.models import Call, CallbackStatus, Job, SigningKey
from ratejobs.services.apis import check_outbound_url
from ratejobs.services.workers import database_now
from ratejobs.signing import SIGNATURE_HEADER, new_secret, signature_header

logger = logging.getLogger(__name__)

CALLBACK_TASK = "ratejobs.job_callback"
EVENT = "job.finished"
EVENT_HEADER = "X-Ratejobs-Event"
DELIVERY_HEADER = "X-Ratejobs-Delivery"
USER_AGENT = "ratejobs-callback/1 (+https://github.com/ratejobs)"
NO_KEY_MESSAGE = "create a signing key first: POST /api/signing-key/"
# A claim outlives the attempt it covers (its total timeout) by this much before the reconciler
# presumes the sender dead.
CLAIM_MARGIN_SECONDS = 30.0
# Of the receiver's answer, only enough to say why it refused.
MAX_ANSWER_BYTES = 4096
MAX_ERROR_CHARS = 300
# A delivery due this long ago and still pending lost its broker message (a Redis restart).
STALE_SECONDS = 60.0


# -- signing keys ----------------------------------------------------------------------------


def signing_key_rotate(*, user: Any) -> tuple[SigningKey, str]:
    """Make the user's signing key, or replace its secret; returns the key and the new secret,
    which is shown this once and stored only encrypted. Callbacks sent from now on are signed
    with it."""
    secret = new_secret()
    now = timezone.now()
    with transaction.atomic():
        key = SigningKey.objects.select_for_update().filter(user=user).first()
        if key is None:
            key = SigningKey.objects.create(
                user=user, secret_encrypted=encrypt_secret(secret), created=now
            )
        else:
            key.secret_encrypted = encrypt_secret(secret)
            key.created = now
            key.rotated = now
            key.save(update_fields=["secret_encrypted", "created", "rotated"])
    return key, secret


def callback_url_check(*, owner: Any, url: str) -> None:
    """ValidationError under `callback_url` unless `url` is a plain http(s) URL (the rules of an
    API's base_url) whose host the outbound policy allows, and the owner has a signing key (a
    callback signed with a secret nobody was shown could not be verified)."""
    if not url:
        return
    check_outbound_url(url, field="callback_url")
    if not SigningKey.objects.filter(user=owner).exists():
        raise ValidationError({"callback_url": NO_KEY_MESSAGE})


# -- a job finishes ----------------------------------------------------------------------------


def callback_fields_on_finish() -> dict[str, Any]:
    """The fields of an UPDATE that finishes jobs: a job with a callback_url gets a new pending
    delivery, in the same statement as its final status."""
    has_callback = ~Q(callback_url="")
    return {
        "callback_status": Case(
            When(has_callback, then=Value(CallbackStatus.PENDING)), default=Value("")
        ),
        "callback_delivery": Case(
            When(has_callback, then=Value(uuid.uuid4(), output_field=UUIDModelField())),
            default=Value(None, output_field=UUIDModelField()),
        ),
        "callback_attempts": 0,
        "callback_last_error": "",
        "callback_next_attempt_at": None,
        "callback_claimed_until": None,
        "callback_delivered_at": None,
    }


def job_callback_queue(*, job_id: int) -> None:
    """Send the job's pending delivery once the transaction commits (at once outside one)."""
    if Job.objects.filter(pk=job_id, callback_status=CallbackStatus.PENDING).exists():
        transaction.on_commit(lambda: _queue(job_id, countdown=0))


def _queue(job_id: int, *, countdown: float) -> None:
    try:
        current_app.send_task(CALLBACK_TASK, args=[job_id], countdown=countdown)
    except Exception:  # the broker is down: the reconciler sends what is due
        logger.warning("could not queue the callback of job %s; the reconciler will", job_id)


# -- sending ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What one attempt's result means for the delivery."""

    kind: Literal["delivered", "retry", "failed"]
    error: str = ""
    retry_after: float | None = None  # the receiver's Retry-After, seconds


def attempt_verdict(result: HttpResult, *, now: float) -> Verdict:
    """2xx: delivered. Network errors, 408, 429 and 5xx: retry (429 and 503 with their
    Retry-After). An address the outbound policy refuses, and any other answer: failed, since
    sending the same again would get the same."""
    if result.error_kind == "refused":
        return Verdict("failed", result.error)
    if result.error_kind is not None:
        return Verdict("retry", result.error)
    code = result.status_code or 0
    if 200 <= code < 300:
        return Verdict("delivered")
    answer = f"the receiver answered {code}"
    snippet = result.body[:200].decode("utf-8", "replace").strip()
    error = f"{answer}: {snippet}" if snippet else answer
    if code in (408, 429) or code >= 500:
        return Verdict("retry", error, parse_retry_after(result.header("Retry-After"), now=now))
    return Verdict("failed", error)


def retry_delay(attempt: int, *, base: float, cap: float, retry_after: float | None) -> float:
    """Seconds before the next attempt after `attempt` attempts (1 or more): half of
    min(cap, base * 2**(attempt-1)) plus a random share of as much again, so receivers coming
    back from an outage are not hit by every sender at once; at least the receiver's
    Retry-After, but never past `cap`."""
    ceiling = backoff_ceiling(attempt - 1, base=base, cap=cap)
    delay = ceiling / 2 + full_jitter(attempt - 1, base=base / 2, cap=cap / 2)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, cap)


def job_callback_send(*, job_id: int) -> str:
    """Make the next attempt of the job's pending delivery, if it is due and no other worker
    holds it; returns "delivered", "retry", "failed" or "skipped"."""
    now = database_now()
    timeout = settings.RATEJOBS_CALLBACK_TIMEOUT
    claimed = (
        # a job being purged is gone from every route: its summary would link to nothing
        Job.objects.filter(
            pk=job_id, callback_status=CallbackStatus.PENDING, purge_started__isnull=True
        )
        .filter(Q(callback_next_attempt_at__isnull=True) | Q(callback_next_attempt_at__lte=now))
        .update(
            callback_status=CallbackStatus.SENDING,
            callback_claimed_until=now + timedelta(seconds=timeout + CLAIM_MARGIN_SECONDS),
            callback_attempts=F("callback_attempts") + 1,
        )
    )
    if not claimed:
        return "skipped"  # delivered, given up, not due yet, or another worker has it
    job = Job.objects.select_related("api").filter(pk=job_id).first()
    if job is None:  # purged meanwhile
        return "skipped"
    try:
        key = SigningKey.objects.get(user_id=job.owner_id)
        secret = decrypt_secret(key.secret_encrypted)
    except SigningKey.DoesNotExist:
        verdict = Verdict("failed", f"the job's owner has no signing key ({NO_KEY_MESSAGE})")
    except CredentialError as exc:
        verdict = Verdict("failed", f"the signing key cannot be read: {exc}")
    else:
        verdict = _attempt(job, secret, timeout)
    return _record(job, verdict)


def _attempt(job: Job, secret: str, timeout: float) -> Verdict:
    body = json.dumps(job_callback_payload(job), separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature_header(secret, body, int(time.time())),
        EVENT_HEADER: EVENT,
        DELIVERY_HEADER: str(job.callback_delivery),
    }
    try:
        request = HttpRequest(
            method="POST",
            url=job.callback_url,
            headers=headers,
            body=body,
            # a redirect elsewhere is followed without the signature
            credential_headers=frozenset({SIGNATURE_HEADER}),
            base_url=job.callback_url,
        )
        # the session (and policy) the API calls use: checked on the address connected to,
        # at every connection and redirect, so a DNS answer that changed since is caught
        session = session_for_process(
            policy_for(settings.RATEJOBS_OUTBOUND_ALLOW),
            pool_maxsize=settings.RATEJOBS_CALLS_IN_FLIGHT,
        )
        result = send(
            session,
            request,
            connect_timeout=min(timeout, 5.0),
            read_timeout=timeout,
            total_timeout=timeout,
            max_body_bytes=MAX_ANSWER_BYTES,
        )
    except ValueError as exc:  # a URL the HTTP client cannot send to: it never will
        return Verdict("failed", str(exc))
    return attempt_verdict(result, now=time.time())


def _record(job: Job, verdict: Verdict) -> str:
    """Write the attempt's outcome, if this worker's claim is still the delivery's."""
    now = database_now()
    # the receiver's words end up in a text column, which cannot hold a NUL
    kind, error = verdict.kind, verdict.error.replace("\x00", "")[:MAX_ERROR_CHARS]
    fields: dict[str, Any] = {"callback_claimed_until": None, "callback_last_error": error}
    delay = 0.0
    if kind == "retry" and job.callback_attempts >= settings.RATEJOBS_CALLBACK_MAX_ATTEMPTS:
        kind = "failed"
        gave_up = f"gave up after {job.callback_attempts} attempts: {error}"
        fields["callback_last_error"] = gave_up[:MAX_ERROR_CHARS]
    if kind == "delivered":
        fields.update(callback_status=CallbackStatus.DELIVERED, callback_delivered_at=now)
    elif kind == "failed":
        fields.update(callback_status=CallbackStatus.FAILED, callback_next_attempt_at=None)
    else:
        delay = retry_delay(
            job.callback_attempts,
            base=settings.RATEJOBS_CALLBACK_BACKOFF_BASE,
            cap=settings.RATEJOBS_CALLBACK_BACKOFF_CAP,
            retry_after=verdict.retry_after,
        )
        fields.update(
            callback_status=CallbackStatus.PENDING,
            callback_next_attempt_at=now + timedelta(seconds=delay),
        )
    recorded = Job.objects.filter(
        pk=job.pk, callback_status=CallbackStatus.SENDING, callback_delivery=job.callback_delivery
    ).update(**fields)
    if not recorded:  # the job finished again meanwhile: a new delivery replaced this one
        return "skipped"
    log = logger.info if kind == "delivered" else logger.warning
    log(
        "job callback: job=%s delivery=%s attempt=%d outcome=%s%s%s",
        job.pk,
        job.callback_delivery,
        job.callback_attempts,
        kind,
        f" retry_in={delay:.3f}s" if kind == "retry" else "",
        f" error={fields['callback_last_error']!r}" if kind != "delivered" else "",
    )
    if kind == "retry":
        _queue(job.pk, countdown=delay)
    return kind


def job_callback_payload(job: Job) -> dict[str, Any]:
    """The summary POSTed for a finished job (the README's "Job callbacks" shows one)."""
    unfinished = job.total - job.done
    counts = {"succeeded": job.succeeded, "failed": job.failed, "cancelled": job.cancelled}
    # only a cancelled job can be final with calls still out: those sent before the cancel
    still = (
        dict(
            Call.objects.filter(job=job, status__in=(Call.Status.PENDING, Call.Status.RUNNING))
            .values_list("status")
            .annotate(n=Count("pk"))
        )
        if unfinished
        else {}
    )
    counts["pending"] = still.get(Call.Status.PENDING, 0)
    counts["running"] = still.get(Call.Status.RUNNING, 0)
    if job.status == Job.Status.CANCELLED:
        outcome = "cancelled"
    elif job.failed or job.cancelled:
        outcome = "completed_with_failures"
    else:
        outcome = "succeeded"
    return {
        "event": EVENT,
        "delivery": str(job.callback_delivery),
        "job": {
            "id": job.pk,
            "uuid": str(job.uuid),
            "name": job.name,
            "api": job.api.name,
            "status": job.status,
            "outcome": outcome,
            "total": job.total,
            "counts": counts,
            "throttled": job.throttled,
            "retries": job.retries,
            "created": _iso(job.created),
            "started": _iso(job.started),
            "finished": _iso(job.finished),
            "results": {
                "jsonl": reverse("api:job-results-jsonl", args=[job.pk]),
                "csv": reverse("api:job-results-csv", args=[job.pk]),
            },
        },
    }


def _iso(moment: Any) -> str | None:
    return None if moment is None else moment.isoformat()


# -- the safety net ------------------------------------------------------------------------------


def callbacks_requeue() -> int:
    """Run by the reconciler: give back deliveries whose sender died (claim expired), and queue
    again those due for a while whose message was lost. Returns how many were queued."""
    now = database_now()
    Job.objects.filter(
        callback_status=CallbackStatus.SENDING, callback_claimed_until__lt=now
    ).update(callback_status=CallbackStatus.PENDING, callback_claimed_until=None)
    stale = now - timedelta(seconds=STALE_SECONDS)
    due = list(
        Job.objects.filter(callback_status=CallbackStatus.PENDING)
        .filter(Q(callback_next_attempt_at__isnull=True) | Q(callback_next_attempt_at__lte=stale))
        .filter(Q(finished__isnull=True) | Q(finished__lte=stale))
        .values_list("pk", flat=True)
    )
    for job_id in due:
        _queue(job_id, countdown=0)
    return len(due)
