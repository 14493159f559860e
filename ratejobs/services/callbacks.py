"""Job callbacks: when a job finishes, POST its summary to the job's callback_url, signed with
its owner's SigningKey (ratejobs.signing), retried with backoff, through the same policed HTTP
path as the API calls but under an address policy of their own (RATEJOBS_CALLBACK_ALLOW: any
user sets a callback_url, while the APIs' allow-list is for internal APIs managers configure).
Also the signing keys themselves.

Each finish of a job is one delivery (a new `callback_delivery` id, the same on every attempt)
whose body is built and stored in the transaction that finishes the job, so every attempt
announces the state the finish had; a job that runs again (its failed calls retried) before its
delivery went out has that delivery superseded, and its next finish makes a new one. A worker
claims the delivery with a conditional UPDATE before sending, so two workers never send it at
once, and records the attempt only while its claim is still the current one. Every attempt
counts, whatever it raises. A worker killed mid-send leaves a claim that expires, and the
reconciler gives the delivery back (or fails it, at its last attempt or past its deadline): that
attempt may reach the receiver twice, with the same X-Ratejobs-Delivery id.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from http import HTTPStatus
from typing import Any, Literal

from celery import current_app
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Case, Count, F, Q, TextField, Value, When
from django.db.models import UUIDField as UUIDModelField
from django.db.models.functions import Cast, Concat
from django.urls import reverse
from django.utils import timezone

from ratejobs.celery_settings import CALLBACK_TASK
from ratejobs.crypto import CredentialError, decrypt_secret, encrypt_secret
from ratejobs.execution.backoff import backoff_ceiling, full_jitter
from ratejobs.execution.connections import session_for_process
from ratejobs.execution.http import HttpResult, send
from ratejobs.execution.outbound import OutboundPolicy, Resolver, policy_for, refused_address
from ratejobs.execution.request import HttpRequest
from ratejobs.execution.targets import validate_base_url
from ratejobs.infra.clock import database_now
from ratejobs.limiter.headers import parse_retry_after
from ratejobs.models import Call, CallbackStatus, Job, SigningKey
from ratejobs.signing import SIGNATURE_HEADER, new_secret, signature_header

logger = logging.getLogger(__name__)

EVENT = "job.finished"
EVENT_HEADER = "X-Ratejobs-Event"
DELIVERY_HEADER = "X-Ratejobs-Delivery"
USER_AGENT = "ratejobs-callback/1 (+https://github.com/ratejobs)"
NO_KEY_MESSAGE = "create a signing key first: POST /api/signing-key/"
CALLBACK_ALLOW_SETTING = "RATEJOBS_CALLBACK_ALLOW"
# The one answer to a callback_url whose address is refused, whatever its range and whether a
# name led there: submitting a URL tells a user nothing of the network beyond "not allowed".
NOT_ALLOWED = (
    "not allowed by the outbound policy for callbacks (public addresses only, unless "
    f"{CALLBACK_ALLOW_SETTING} allows more)"
)
NOT_ALLOWED_MESSAGE = f"this address is {NOT_ALLOWED}"
# What the job's owner reads of an attempt that got no answer: our words, never the receiver's
# nor the addresses the worker resolved; the details go to the worker's log (Verdict.detail).
NETWORK_ERRORS = {
    "refused": f"nothing was sent: the address connected to is {NOT_ALLOWED}",
    "connect": "could not connect to the receiver",
    "timeout": "no complete answer from the receiver in time (RATEJOBS_CALLBACK_TIMEOUT)",
    "connection": "the connection to the receiver broke before its answer was complete",
}
# A claim outlives the attempt it covers (its total timeout) by this much before the reconciler
# presumes the sender dead.
CLAIM_MARGIN_SECONDS = 30.0
# The receiver's answer is read this far, so a short one leaves its connection reusable, and
# dropped: only its status is kept (its body may be a server the owner could not otherwise read).
MAX_ANSWER_BYTES = 4096
MAX_ERROR_CHARS = 300
# A delivery due this long ago and still pending lost its broker message (a Redis restart).
STALE_SECONDS = 60.0
SUPERSEDED = (
    "superseded: the job ran again (its failed calls retried) before this delivery went out; "
    "its next finish sends a new one"
)
CLAIM_EXPIRED = "the sender of the last attempt stopped before recording it (its claim expired)"


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


def callback_policy() -> OutboundPolicy:
    """Where callbacks may connect: public addresses, plus RATEJOBS_CALLBACK_ALLOW (never the
    APIs' RATEJOBS_OUTBOUND_ALLOW)."""
    return policy_for(settings.RATEJOBS_CALLBACK_ALLOW, setting=CALLBACK_ALLOW_SETTING)


def callback_url_check(*, owner: Any, url: str, resolver: Resolver = socket.getaddrinfo) -> None:
    """ValidationError under `callback_url` unless `url` is a plain http(s) URL (the rules of an
    API's base_url) whose host the callback policy allows (NOT_ALLOWED_MESSAGE, whatever the
    reason), and the owner has a signing key (a callback signed with a secret nobody was shown
    could not be verified). `resolver` is socket.getaddrinfo's signature, for tests."""
    if not url:
        return
    try:
        validate_base_url(url)
        refused = refused_address(url, callback_policy(), resolver)
    except ValueError as exc:  # the URL's own text: saying what is wrong with it tells nothing
        message = str(exc).replace("base_url", "callback_url")
        raise ValidationError({"callback_url": message}) from exc
    if refused is not None:
        raise ValidationError({"callback_url": NOT_ALLOWED_MESSAGE})
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
        "callback_body": "",  # job_callback_prepare writes the new delivery's
    }


def job_callback_prepare(*, job_id: int) -> None:
    """Right after the UPDATE that finished the job (callback_fields_on_finish), in its
    transaction: store the body its new delivery sends, and send it once this commits."""
    job = (
        Job.objects.select_related("api")
        .filter(pk=job_id, callback_status=CallbackStatus.PENDING)
        .first()
    )
    if job is None:
        return
    # built now, not when sent: the job may change meanwhile (calls of a cancelled job finish
    # on the wire), and a delivery carries the state its finish announced
    Job.objects.filter(pk=job_id).update(callback_body=_payload_text(job))
    transaction.on_commit(lambda: _queue(job_id, countdown=0))


def job_callback_supersede(*, job_id: int) -> None:
    """The job runs again (its failed calls retried): its delivery not yet out announces a
    finish that no longer holds, so it is not sent; the caller holds the job's row lock. An
    attempt already on the wire may still arrive; its outcome is not recorded."""
    Job.objects.filter(
        pk=job_id, callback_status__in=(CallbackStatus.PENDING, CallbackStatus.SENDING)
    ).update(
        callback_status=CallbackStatus.FAILED,
        callback_last_error=SUPERSEDED,
        callback_next_attempt_at=None,
        callback_claimed_until=None,
    )


def _queue(job_id: int, *, countdown: float) -> None:
    # A Redis broker hands a message that waited its visibility timeout, countdown included, to
    # a second worker: a longer wait (a receiver's Retry-After) goes in steps of half of it,
    # each run finding the delivery not yet due and queueing the next (job_callback_send).
    step = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600) / 2
    try:
        current_app.send_task(CALLBACK_TASK, args=[job_id], countdown=min(countdown, step))
    except Exception:  # the broker is down: the reconciler sends what is due
        logger.warning("could not queue the callback of job %s; the reconciler will", job_id)


# -- sending ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What one attempt's result means for the delivery."""

    kind: Literal["delivered", "retry", "failed"]
    error: str = ""  # stored on the job, which its owner reads
    retry_after: float | None = None  # the receiver's Retry-After, seconds
    detail: str = ""  # for the worker's log only (the network error as the HTTP client saw it)


def attempt_verdict(result: HttpResult, *, now: float) -> Verdict:
    """2xx: delivered. Network errors, 408, 429 and 5xx: retry (429 and 503 with their
    Retry-After). An address the callback policy refuses, and any other answer: failed, since
    sending the same again would get the same. The error is in our words: the status code and
    its standard reason phrase, or a fixed reason per network error; never the receiver's body,
    which could be a server the owner may not read."""
    if result.error_kind is not None:
        kind = "failed" if result.error_kind == "refused" else "retry"
        return Verdict(kind, NETWORK_ERRORS[result.error_kind], detail=result.error)
    code = result.status_code or 0
    if 200 <= code < 300:
        return Verdict("delivered")
    error = f"the receiver answered {_status_text(code)}"
    if 300 <= code < 400:
        error += ": a redirect is not followed, set callback_url to the URL that answers"
    if code in (408, 429) or code >= 500:
        return Verdict("retry", error, parse_retry_after(result.header("Retry-After"), now=now))
    return Verdict("failed", error)


def _status_text(code: int) -> str:
    try:
        return f"{code} ({HTTPStatus(code).phrase})"
    except ValueError:  # not a status Python knows: the number alone
        return str(code)


def retry_delay(attempt: int, *, base: float, cap: float, retry_after: float | None) -> float:
    """Seconds before the next attempt after `attempt` attempts (1 or more): half of
    min(cap, base * 2**(attempt-1)) plus a random share of as much again, so receivers coming
    back from an outage are not hit by every sender at once; at least the receiver's
    Retry-After, however long (the delivery's deadline bounds that, not `cap`)."""
    ceiling = backoff_ceiling(attempt - 1, base=base, cap=cap)
    delay = ceiling / 2 + full_jitter(attempt - 1, base=base / 2, cap=cap / 2)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


def callback_deadline(job: Job) -> datetime:
    """The latest the delivery's next attempt may be due: RATEJOBS_CALLBACK_DEADLINE_SECONDS
    after the job finished."""
    finished = job.finished or database_now()  # a finished job has one; else from now on
    return finished + timedelta(seconds=settings.RATEJOBS_CALLBACK_DEADLINE_SECONDS)


def job_callback_send(*, job_id: int) -> str:
    """Make the next attempt of the job's pending delivery, if it is due and no other worker
    holds it (a message that came early is queued again for when it is due); returns
    "delivered", "retry", "failed" or "skipped"."""
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
        _queue_next_step(job_id, now=now)
        return "skipped"  # delivered, given up, not due yet, or another worker has it
    job = Job.objects.select_related("api").filter(pk=job_id).first()
    if job is None:  # purged meanwhile
        return "skipped"
    try:
        verdict = _attempt(job, timeout)
    except Exception as exc:
        # A bug or a database hiccup in the attempt is still an attempt: recorded as a retry,
        # so RATEJOBS_CALLBACK_MAX_ATTEMPTS ends it, rather than left "sending" for the
        # reconciler to give back for ever. The receiver sees the type; the log has the rest.
        logger.exception(
            "job callback: job=%s delivery=%s attempt=%d raised",
            job.pk,
            job.callback_delivery,
            job.callback_attempts,
        )
        verdict = Verdict(
            "retry", f"the attempt raised {type(exc).__name__} (see the worker's log)"
        )
    return _record(job, verdict)


def _queue_next_step(job_id: int, *, now: datetime) -> None:
    """A message that came before its delivery was due (a long wait goes to the broker in
    steps, see _queue; or the worker's clock is ahead of the database's): queue the next."""
    due = (
        Job.objects.filter(
            pk=job_id,
            callback_status=CallbackStatus.PENDING,
            purge_started__isnull=True,
            callback_next_attempt_at__gt=now,
        )
        .values_list("callback_next_attempt_at", flat=True)
        .first()
    )
    if due is not None:
        _queue(job_id, countdown=(due - now).total_seconds())


def _attempt(job: Job, timeout: float) -> Verdict:
    try:
        key = SigningKey.objects.get(user_id=job.owner_id)
        secret = decrypt_secret(key.secret_encrypted)
    except SigningKey.DoesNotExist:
        return Verdict("failed", f"the job's owner has no signing key ({NO_KEY_MESSAGE})")
    except CredentialError as exc:
        return Verdict("failed", f"the signing key cannot be read: {exc}")
    # a delivery made before its body was stored with it (migration 0014) is built now
    body = (job.callback_body or _payload_text(job)).encode()
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
            credential_headers=frozenset({SIGNATURE_HEADER}),
            base_url=job.callback_url,
        )
        # the API calls' HTTP client, under the callback policy (a session, and connection
        # pool, of its own): checked on the address connected to, so a DNS answer that changed
        # since the submit is caught
        session = session_for_process(
            callback_policy(), pool_maxsize=settings.RATEJOBS_CALLS_IN_FLIGHT
        )
        result = send(
            session,
            request,
            connect_timeout=min(timeout, 5.0),
            read_timeout=timeout,
            total_timeout=timeout,
            max_body_bytes=MAX_ANSWER_BYTES,
            # A redirect is the receiver's answer, not followed: a 301, 302 or 303 would turn
            # the POST into a GET without its body whose 2xx would count as delivered, and a
            # 307 elsewhere would arrive unsigned. The callback_url is the URL that answers.
            max_redirects=0,
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
    if kind == "retry":
        delay = retry_delay(
            job.callback_attempts,
            base=settings.RATEJOBS_CALLBACK_BACKOFF_BASE,
            cap=settings.RATEJOBS_CALLBACK_BACKOFF_CAP,
            retry_after=verdict.retry_after,
        )
        gave_up = _gave_up(job, verdict, delay=delay, due=now + timedelta(seconds=delay))
        if gave_up:
            kind, fields["callback_last_error"] = "failed", f"{gave_up}: {error}"[:MAX_ERROR_CHARS]
    if kind == "delivered":
        fields.update(callback_status=CallbackStatus.DELIVERED, callback_delivered_at=now)
    elif kind == "failed":
        fields.update(callback_status=CallbackStatus.FAILED, callback_next_attempt_at=None)
    else:
        fields.update(
            callback_status=CallbackStatus.PENDING,
            callback_next_attempt_at=now + timedelta(seconds=delay),
        )
    recorded = Job.objects.filter(
        pk=job.pk, callback_status=CallbackStatus.SENDING, callback_delivery=job.callback_delivery
    ).update(**fields)
    if not recorded:  # a new delivery replaced this one (the job finished again), or the job
        return "skipped"  # runs again and superseded it
    log = logger.info if kind == "delivered" else logger.warning
    log(
        "job callback: job=%s delivery=%s attempt=%d outcome=%s%s%s%s",
        job.pk,
        job.callback_delivery,
        job.callback_attempts,
        kind,
        f" retry_in={delay:.3f}s" if kind == "retry" else "",
        f" error={fields['callback_last_error']!r}" if kind != "delivered" else "",
        f" detail={verdict.detail!r}" if verdict.detail else "",
    )
    if kind == "retry":
        _queue(job.pk, countdown=delay)
    return kind


def _gave_up(job: Job, verdict: Verdict, *, delay: float, due: datetime) -> str:
    """Why a retry is not made (empty: it is): the attempts are used up, or it would be due
    after the delivery's deadline, be it the backoff's wait or the receiver's Retry-After."""
    if job.callback_attempts >= settings.RATEJOBS_CALLBACK_MAX_ATTEMPTS:
        return f"gave up after {job.callback_attempts} attempts"
    deadline = callback_deadline(job)
    if due <= deadline:
        return ""
    asked = verdict.retry_after is not None and verdict.retry_after >= delay
    wait = f"the receiver's Retry-After of {delay:.0f} s" if asked else f"a wait of {delay:.0f} s"
    return (
        f"gave up: {wait} ends past the delivery's deadline "
        f"({deadline.isoformat(timespec='seconds')}, RATEJOBS_CALLBACK_DEADLINE_SECONDS after "
        "the job finished)"
    )


def _payload_text(job: Job) -> str:
    return json.dumps(job_callback_payload(job), separators=(",", ":"))


def job_callback_payload(job: Job) -> dict[str, Any]:
    """The summary POSTed for a finished job (the README's "Job callbacks" shows one), built
    as it finishes (job_callback_prepare)."""
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
    """Run by the reconciler: give back deliveries whose sender died (claim expired), or fail
    them when that was their last attempt or their deadline has passed; and queue again those
    due for a while whose message was lost. Returns how many were queued."""
    now = database_now()
    out_of_attempts = Q(callback_attempts__gte=settings.RATEJOBS_CALLBACK_MAX_ATTEMPTS)
    deadline = timedelta(seconds=settings.RATEJOBS_CALLBACK_DEADLINE_SECONDS)
    past_deadline = Q(finished__lt=now - deadline)
    gave_up = out_of_attempts | past_deadline
    Job.objects.filter(
        callback_status=CallbackStatus.SENDING, callback_claimed_until__lt=now
    ).update(
        callback_status=Case(
            When(gave_up, then=Value(CallbackStatus.FAILED)), default=Value(CallbackStatus.PENDING)
        ),
        callback_last_error=Case(
            When(
                out_of_attempts,
                then=Concat(
                    Value("gave up after "),
                    Cast("callback_attempts", output_field=TextField()),
                    Value(f" attempts: {CLAIM_EXPIRED}"),
                    output_field=TextField(),
                ),
            ),
            When(
                past_deadline,
                then=Value(f"gave up: the delivery's deadline has passed: {CLAIM_EXPIRED}"),
            ),
            default=Value(CLAIM_EXPIRED),
            output_field=TextField(),
        ),
        callback_next_attempt_at=Case(
            When(gave_up, then=Value(None)), default=F("callback_next_attempt_at")
        ),
        callback_claimed_until=None,
    )
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
