"""Running calls: claim a batch in one statement, send each through the shared limiter (no
database on the way), record the outcomes of many calls in one transaction.

The engine (worker/engine.py) runs these for a worker process, the send on its pool of
threads; call_attempt_by_id runs one call start to end in the caller's thread."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import requests
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, Subquery
from django.db.models.functions import Coalesce

from ratejobs.crypto import CredentialError, resolve_credential
from ratejobs.execution.attempt import (
    ExecutionPolicy,
    Outcome,
    attempt_call,
    outcome_without_response,
    slot_too_far,
)
from ratejobs.execution.connections import session_for_process
from ratejobs.execution.outbound import policy_for
from ratejobs.execution.outcome import Decision
from ratejobs.execution.request import HttpRequest, build_request, merge_headers
from ratejobs.infra.clock import database_now
from ratejobs.infra.heartbeats import owner_is_dead, process_owner, worker_heartbeat
from ratejobs.infra.limiters import api_limiter
from ratejobs.infra.wakeups import request_dispatch
from ratejobs.limiter import Grant, Limiter, LimiterError
from ratejobs.limiter.headers import is_hint_field
from ratejobs.models import Api, Call, CallAttempt, Job, ThrottleEvent
from ratejobs.services.credentials import KeySecret, key_secrets
from ratejobs.services.jobs import job_complete_if_done, job_seconds_add

logger = logging.getLogger(__name__)

# Columns of a call an attempt does not read: its last response may be large.
UNNEEDED_TO_SEND = ("response_headers", "response_body", "error")
# A claimed call belongs to its process for the longest an attempt can take plus this margin
# (or until the process stops sending heartbeats); then another may take it over.
CLAIM_MARGIN_SECONDS = 60.0
# Of a response's headers, an attempt keeps at most this many of those the limiter reads, each
# value cut to THROTTLE_HEADER_CHARS: a server sending hundreds would otherwise make every
# attempt's row as large as a response.
THROTTLE_HEADERS_KEPT = 20
THROTTLE_HEADER_CHARS = 200
RETRY_AFTER_CHARS = CallAttempt._meta.get_field("retry_after").max_length


@dataclass(frozen=True)
class ApiContext:
    """What every call of one claim needs from its API, worked out once per claim: decrypting
    the credential and building the limiter per call cost more CPU than sending it."""

    secret: str | None = field(repr=False)
    credential_error: str | None
    limiter: Limiter
    policy: ExecutionPolicy
    session: requests.Session  # the process's, for the outbound policy


@dataclass(frozen=True)
class Claimed:
    call: Call  # with its job and API loaded, shared by the calls of one claim
    token: str
    context: ApiContext
    reserved: Grant | None = None  # a limiter slot reserved with the claim's others
    # Seconds to the next slot when it is beyond RATEJOBS_MAX_WORKER_WAIT (the claim's batch
    # stopped there): the call is not started but goes back, due when the slot would come.
    slot_in: float | None = None
    # Counted in this process's share of its API (the worker engine's): given back when it ends.
    in_share: bool = False


@dataclass(frozen=True)
class Finished:
    claimed: Claimed
    outcome: Outcome
    # When the attempt ended (this process's monotonic clock): its attempt row is dated on
    # the database's clock from it, however long the outcome waited for the recorder.
    ended: float = field(default_factory=time.monotonic, compare=False)


def claim_hold_seconds(api: Api) -> float:
    return (
        settings.RATEJOBS_MAX_WORKER_WAIT
        + execution_policy(api).lease_seconds
        + CLAIM_MARGIN_SECONDS
    )


def calls_claim(
    *, job_id: int, call_ids: Iterable[int], owner: str, token: str | None = None
) -> list[Claimed]:
    """Claim those of the job's `call_ids` that are still wanted (dispatched, due, job active,
    not held by a live process) for `owner`, in one statement; returns them with their job and
    API loaded. `token` names the claim (a new one when not given), so that a claim that
    failed part way can be given back (reconcile.calls_release_claim)."""
    call_ids = list(call_ids)
    job = Job.objects.select_related("api").filter(pk=job_id).first()
    if job is None or not call_ids:
        return []
    api = job.api
    token = token or uuid.uuid4().hex
    now = database_now()
    if job.deadline is not None and job.deadline <= now:
        return []  # not started by the deadline: the reconciler cancels them with that reason
    # The claimable rows are locked in id order, skipping those another transaction holds
    # (a pause or a cancel changing them, another claim): the claim never waits on a row, so
    # it can never be part of a deadlock, and a call being cancelled is left to the cancel.
    # The job's status is read through a subquery, not a join: on PostgreSQL an UPDATE with a
    # join becomes `WHERE id IN (SELECT ...)`, which re-checks nothing of the join.
    claimable = (
        Call.objects.filter(
            pk__in=call_ids,
            job_id=job_id,
            job_id__in=Job.objects.filter(status__in=Job.ACTIVE).values("pk"),
            dispatched_at__isnull=False,
        )
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .filter(
            Q(status=Call.Status.PENDING)
            | Q(Q(running_until__lt=now) | owner_is_dead(now), status=Call.Status.RUNNING)
        )
        .order_by("pk")
        .select_for_update(skip_locked=True)
        .values("pk")
    )
    with transaction.atomic():
        claimed = Call.objects.filter(pk__in=Subquery(claimable)).update(
            status=Call.Status.RUNNING,
            claim_token=token,
            running_until=now + timedelta(seconds=claim_hold_seconds(api)),
            claim_owner=owner,
            started=Coalesce(F("started"), now),
        )
    if not claimed:
        return []
    # The last response of a call being retried is not needed to send it again.
    calls = list(Call.objects.defer(*UNNEEDED_TO_SEND).filter(pk__in=call_ids, claim_token=token))
    contexts = api_contexts(api, {call_credential_key(call, job) for call in calls})
    claims = []
    for call in calls:
        call.job = job
        context = contexts[call_credential_key(call, job)]
        kept = call_kept_place(call, context.limiter.name)
        claims.append(Claimed(call, token, context, reserved=kept))
    return claims


def call_kept_place(call: Call, limiter_name: str) -> Grant | None:
    """The limiter slot kept for `call` by its last attempt (Outcome.place), to be confirmed
    rather than a new one taken; None when it has none, or one of another bucket."""
    kept = call.reservation
    if not kept or kept.get("limiter") != limiter_name:
        return None
    return Grant(
        lease_id=kept["lease"],
        weight=kept["weight"],
        slot_us=kept["slot_us"],
        granted_us=kept["slot_us"],
        generation=kept["generation"],
        waited=0.0,
        ready=False,
        # the limiter's reply says how far the slot still is: ask at once
        due=time.monotonic(),
        lease_seconds=kept["lease_seconds"],
        cost=kept["cost"],
        cost_seq=kept["cost_seq"],
        leased=kept.get("leased", True),
    )


def _kept_place_fields(place: Grant, limiter_name: str) -> dict:
    return {
        "limiter": limiter_name,
        "lease": place.lease_id,
        "weight": place.weight,
        "slot_us": place.slot_us,
        "generation": place.generation,
        "lease_seconds": place.lease_seconds,
        "cost": place.cost,
        "cost_seq": place.cost_seq,
        "leased": place.leased,
    }


def call_credential_key(call: Call, job: Job) -> str:
    """The credential key the call is sent with: its own, else its job's; "": the API's own."""
    return call.credential_key or job.credential_key


def calls_reserve_slots(claims: list[Claimed]) -> list[Claimed]:
    """Reserve limiter slots for one claim's calls in one round trip (acquire_many), as many as
    come within RATEJOBS_MAX_WORKER_WAIT and, for an API with an in-flight cap, as many as
    there are places free now; the others acquire their own when they run (waiting for a
    released place on their own thread, woken by the release, never the claiming thread)."""
    if not claims:
        return claims
    # Calls naming credential keys go by limiter: one acquire_many per bucket. A call with a
    # kept place confirms that one.
    groups: dict[str, list[Claimed]] = defaultdict(list)
    reserved: list[Claimed] = []
    for item in claims:
        if item.reserved is not None:
            reserved.append(item)
        else:
            groups[item.context.limiter.name].append(item)
    unreserved: list[Claimed] = []
    for group in groups.values():
        done, slot_in = _reserve_group(group)
        reserved += done
        # A call with a cost asks on its own and keeps its place (P5 in docs/limiter.md): a
        # large one sent back would come back behind the smaller ones every time.
        unreserved += [
            replace(item, slot_in=None if item.call.cost else slot_in)
            for item in group[len(done) :]
        ]
    return reserved + unreserved


def calls_slot_too_far(claimed: Claimed) -> Outcome:
    """The outcome of a claimed call whose next slot is beyond the worker's wait (slot_in):
    what its own attempt would have recorded, without a thread, a round trip or a request."""
    decision = slot_too_far(
        claimed.context.limiter.name, claimed.slot_in, settings.RATEJOBS_MAX_WORKER_WAIT
    )
    # as attempt number attempts + 1, which a "wait" does not use up
    return outcome_without_response(
        decision, 0.0, claimed.call.attempts + 1, claimed.call.throttled_count
    )


def _reserve_group(claims: list[Claimed]) -> tuple[list[Claimed], float | None]:
    """Reserve slots for the first of `claims` (all of one limiter); returns those reserved,
    and how far the next slot is when the batch stopped beyond the worker's wait (None when
    it did not: the others then ask on their own)."""
    context = claims[0].context
    try:
        batch = context.limiter.acquire_many(
            len(claims),
            # each slot takes its call's estimated cost from the cost windows
            costs=[item.call.cost for item in claims],
            max_wait=settings.RATEJOBS_MAX_WORKER_WAIT,
            lease_seconds=context.policy.lease_seconds,
            wait_for_room=False,
        )
    except LimiterError:  # each call tries again on its own and records why it could not
        return [], None
    except Exception:  # the calls are claimed: they must still run, and record what happens
        logger.exception("limiter %r: could not reserve slots for a batch", context.limiter.name)
        return [], None
    done = [replace(item, reserved=grant) for item, grant in zip(claims, batch, strict=False)]
    too_far = len(batch) < len(claims) and not batch.at_capacity and batch.retry_after > 0
    return done, batch.retry_after if too_far else None


def api_contexts(api: Api, credential_keys: Iterable[str]) -> dict[str, ApiContext]:
    """The context of each credential key ("" for the API's own), the keys' secrets read in
    one query."""
    keys = set(credential_keys)
    named = key_secrets(api=api, keys=keys - {""}) if keys - {""} else {}
    return {key: api_context(api, key, named.get(key)) for key in keys}


def api_context(
    api: Api, credential_key: str = "", key_secret: KeySecret | None = None
) -> ApiContext:
    """What calls of `api` sent with `credential_key` need: its secret (`key_secret`, from
    services.credentials.key_secrets) and its own limiter bucket; "": the API's own."""
    if credential_key:
        if key_secret is None:
            key_secret = key_secrets(api=api, keys=[credential_key])[credential_key]
        secret, error = key_secret.secret, key_secret.error
    else:
        try:
            secret = resolve_credential(
                credential_env=api.credential_env, credential_encrypted=api.credential_encrypted
            )
            error = None
        except CredentialError as exc:
            secret, error = None, str(exc)
    return ApiContext(
        secret=secret,
        credential_error=error,
        limiter=api_limiter(api, credential_key),
        policy=execution_policy(api),
        session=session_for_process(
            policy_for(settings.RATEJOBS_OUTBOUND_ALLOW),
            pool_maxsize=settings.RATEJOBS_CALLS_IN_FLIGHT,
        ),
    )


def execution_policy(api: Api) -> ExecutionPolicy:
    return ExecutionPolicy(
        read_timeout=api.timeout,
        max_body_bytes=settings.RATEJOBS_MAX_RESPONSE_BYTES,
        max_attempts=api.max_attempts,
        max_throttled_retries=api.max_throttled_retries,
        retry_conflicts=bool(api.idempotency_header),
        cost_header=api.cost_header,
        cost_json_field=api.cost_json_field,
    )


def call_idempotency_key(call: Call) -> str:
    """What the API's idempotency_header carries for `call`: the same on every attempt
    (retries, crashes, redispatches), different for every call of every job anywhere."""
    return f"{call.job.uuid}-{call.index}"


def call_request(call: Call, api: Api, secret: str | None) -> HttpRequest:
    extra = {"json": call.json} if call.json is not None else {}
    defaults = api.default_headers
    if api.idempotency_header:
        # Under the call's own headers: a key the submitter gave the call wins.
        defaults = merge_headers(defaults, {api.idempotency_header: call_idempotency_key(call)})
    return build_request(
        method=call.method,
        base_url=api.base_url,
        path=call.path,
        query=call.query,
        headers=merge_headers(defaults, call.headers or {}),
        body=call.body,
        credentials={api.auth_header: secret} if secret else None,
        **extra,
    )


def call_attempt(claimed: Claimed) -> Outcome:
    """One attempt of a claimed call through its API's shared limiter: the call's request
    built, then attempt_call (ratejobs.execution). Touches no database, so any number of these
    run at once on a worker's threads."""
    call, context = claimed.call, claimed.context
    api = call.job.api
    try:
        if context.credential_error is not None:
            raise ValueError(context.credential_error)
        request = call_request(call, api, context.secret)
    except ValueError as exc:  # nothing can be sent: no attempt used
        if claimed.reserved is not None:
            with contextlib.suppress(LimiterError):  # else its lease expires by itself
                context.limiter.release(claimed.reserved)
        return outcome_without_response(
            Decision("failed", error=str(exc)), 0.0, call.attempts, call.throttled_count
        )
    return attempt_call(
        request,
        limiter=context.limiter,
        session=context.session,
        policy=context.policy,
        attempts=call.attempts + 1,
        throttled_retries=call.throttled_count,
        max_wait=settings.RATEJOBS_MAX_WORKER_WAIT,
        # The caller returns the lease with others, one round trip for many: the worker's
        # engine as soon as the response is in (calls_return_leases), else
        # calls_record_outcomes with the outcome.
        return_lease=False,
        reserved=claimed.reserved,
        cost=call.cost,
        # a call whose slot is beyond the wait keeps it and comes back for it (Outcome.place)
        keep_place=True,
    )


def call_attempt_by_id(*, call_id: int) -> str:
    """One attempt of the call `call_id`, start to end in this thread: claimed, call_attempt,
    recorded (what a worker does for each call of a message, without its pool); safe to run
    twice for one call."""
    owner = process_owner()
    worker_heartbeat(owner=owner)
    job_id = Call.objects.filter(pk=call_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return "missing"
    claimed = calls_claim(job_id=job_id, call_ids=[call_id], owner=owner)
    if not claimed:
        return "skipped"  # final, cancelled, paused, not due, or another process has it
    outcome = call_attempt(claimed[0])
    calls_record_outcomes([Finished(claimed[0], outcome)])
    return outcome.kind


def calls_record_outcomes(finished: list[Finished]) -> int:
    """Write the outcomes of many attempts in one transaction, each once: only the holder of a
    call's claim may write it. Returns how many were written."""
    if not finished:
        return 0
    throttle_logs: list[tuple[Finished, list[str]]] = []
    with transaction.atomic():
        now = database_now()
        now_monotonic = time.monotonic()
        # Lock the jobs first, in id order, as job_cancel and job_pause do: a cancel cannot
        # slip between the check below and the writes, so an attempt that ends in a retry
        # never leaves a pending call behind in a cancelled job.
        job_status = dict(
            Job.objects.select_for_update()
            .filter(pk__in={f.claimed.call.job_id for f in finished})
            .order_by("pk")
            .values_list("pk", "status")
        )
        tokens = dict(
            Call.objects.filter(
                pk__in=[f.claimed.call.pk for f in finished], status=Call.Status.RUNNING
            ).values_list("pk", "claim_token")
        )
        # others were presumed dead and taken over: their results count, not these
        owned = [f for f in finished if tokens.get(f.claimed.call.pk) == f.claimed.token]
        rows: dict[tuple[str, ...], list[dict]] = defaultdict(list)
        counters: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        events: list[ThrottleEvent] = []
        attempts: list[CallAttempt] = []
        for item in owned:
            call, outcome = item.claimed.call, item.outcome
            kind = outcome.kind
            if kind not in ("succeeded", "failed") and job_status[call.job_id] == "cancelled":
                kind = "cancelled"
            fields = _outcome_fields(outcome, kind, now, item.claimed.context.limiter.name)
            rows[tuple(sorted(fields))].append({**fields, "id": call.pk})
            job_counters = counters[call.job_id]
            if kind in Call.FINAL:
                job_counters[kind] += 1
            if kind in ("retry", "throttled"):
                job_counters["retries"] += 1
            if outcome.decision.throttle:
                job_counters["throttled"] += 1
            kinds = _throttle_events(call, outcome, events)
            if _attempt_kept(item, kind):
                ended_at = now - timedelta(seconds=max(0.0, now_monotonic - item.ended))
                attempts.append(_attempt_row(item, kind, ended_at))
            if kinds:
                throttle_logs.append((item, kinds))
        for names, same_fields in rows.items():
            _update_calls(names, same_fields)
        for job_id, job_counters in sorted(counters.items()):
            if job_counters:
                Job.objects.filter(pk=job_id).update(
                    **{name: F(name) + n for name, n in job_counters.items()}
                )
                job_complete_if_done(job_id=job_id)
        job_seconds_add(
            {job_id: c["succeeded"] + c["failed"] for job_id, c in counters.items()}, now
        )
        ThrottleEvent.objects.bulk_create(events)
        CallAttempt.objects.bulk_create(attempts)
        api_ids = {f.claimed.call.job.api_id for f in finished}
        transaction.on_commit(lambda: [request_dispatch(api_id) for api_id in sorted(api_ids)])
    for item, kinds in throttle_logs:
        _log_throttle_decision(item.claimed.call, item.outcome, kinds)
    kept = {
        item.outcome.place.lease_id
        for item in owned
        if item.outcome.place is not None and item.outcome.kind not in Call.FINAL
        and job_status[item.claimed.call.job_id] != "cancelled"
    }  # fmt: skip
    _return_leases(finished, kept=kept)
    return len(owned)


def _update_calls(names: tuple[str, ...], rows: list[dict]) -> None:
    """One UPDATE statement run for many rows (psycopg pipelines them in one round trip):
    Django's bulk_update builds a CASE per field and row, which cost more CPU than the calls'
    HTTP requests in the profile of bench-jobs."""
    fields = [Call._meta.get_field(name) for name in names]
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(field.column)} = %s" for field in fields)
    # names come from the model, never from input; values go as parameters
    sql = f"UPDATE {quote(Call._meta.db_table)} SET {assignments} WHERE {quote('id')} = %s"  # noqa: S608
    params = [
        [field.get_db_prep_save(row[field.name], connection) for field in fields] + [row["id"]]
        for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _return_leases(finished: list[Finished], *, kept: set[str]) -> None:
    """Return the leases the attempts handed back, and those of places not kept (`kept`: the
    lease ids of the places written to their calls), with the real cost the handed-back ones
    reported (calls_return_leases)."""
    returns: list[LeaseReturn] = []
    for item in finished:
        outcome, limiter = item.outcome, item.claimed.context.limiter
        if outcome.lease is not None:
            returns.append(LeaseReturn(limiter, outcome.lease, outcome.cost_used))
        place = outcome.place
        if place is not None and place.lease_id not in kept:
            returns.append(LeaseReturn(limiter, place, None))
    calls_return_leases(returns)


@dataclass(frozen=True)
class LeaseReturn:
    """A lease to give back, and the real cost its response reported (None: not said)."""

    limiter: Limiter
    lease: Grant
    cost_used: int | None


def calls_return_leases(returns: Iterable[LeaseReturn]) -> None:
    """Return leases and settle the costs reported with them, one round trip per limiter (an
    API's own, or a credential key's bucket); a lease not returned expires by itself, a cost
    not settled leaves the estimate."""
    by_limiter: dict[str, list] = defaultdict(list)
    settles: dict[str, list] = defaultdict(list)
    limiters: dict[str, Limiter] = {}
    for item in returns:
        name = item.limiter.name
        limiters[name] = item.limiter
        by_limiter[name].append(item.lease)
        if item.cost_used is not None:
            settles[name].append((item.lease, item.cost_used))
    for name, leases in by_limiter.items():
        try:
            limiters[name].release_many(leases, settles=settles[name])
        except (LimiterError, ValueError) as exc:
            logger.warning(
                "limiter %r: %d leases not returned, %d costs not settled: %s",
                name, len(leases), len(settles[name]), exc,
            )  # fmt: skip


def _outcome_fields(outcome: Outcome, kind: str, now, limiter_name: str) -> dict:
    place = outcome.place if kind not in Call.FINAL else None
    fields: dict = {
        "claim_token": "",
        "claim_owner": "",
        "running_until": None,
        "dispatched_at": None,
        "attempts": outcome.attempts,
        "throttled_count": outcome.throttled_retries,
        "error": outcome.error,
        # an attempt uses up the place it had: it was confirmed, or kept again (a new one)
        "reservation": _kept_place_fields(place, limiter_name) if place is not None else None,
    }
    result = outcome.result
    if result is not None:  # a call with no response this time keeps the last one it had
        fields.update(
            status_code=result.status_code,
            response_headers=result.headers,
            response_body=result.body,
            response_truncated=result.truncated,
            response_removed_at=None,  # a new response replaces one retention removed
            duration=result.duration,
        )
    if outcome.cost_used is not None:
        fields["cost_used"] = outcome.cost_used
    if kind in Call.FINAL:
        fields.update(status=kind, finished=now, next_attempt_at=None)
    else:
        fields.update(
            status=Call.Status.PENDING,
            next_attempt_at=now + timedelta(seconds=outcome.retry_after),
        )
    return fields


def _attempt_number(call: Call) -> int:
    # Each attempt that is not a wait adds one to either counter (a throttle does not use up
    # an attempt): the claim's counters say how many came before, with no query.
    return call.attempts + call.throttled_count + 1


def _attempt_kept(item: Finished, kind: str) -> bool:
    """Whether the attempt gets a row of its own. A wait sent nothing. A call's first attempt
    that was also its last is the call's own row (status, duration, finish, error): a row for
    it would be the recorder's largest write for what most calls need no history of (the
    plain bench-jobs row, about 1,250 calls/s on 2 processes, lost 9 % to it)."""
    if kind == "wait":
        return False
    return not (kind in Call.FINAL and _attempt_number(item.claimed.call) == 1)


def _attempt_row(item: Finished, kind: str, ended_at: datetime) -> CallAttempt:
    """The row of one attempt, `kind` what the recorder made of it (a retry in a cancelled
    job ends as "cancelled")."""
    call, outcome = item.claimed.call, item.outcome
    result = outcome.result
    duration = result.duration if result is not None else None
    headers = result.headers if result is not None else {}
    kept = throttle_headers(headers)
    return CallAttempt(
        job_id=call.job_id,
        call_id=call.pk,
        number=_attempt_number(call),
        outcome=kind,
        started=ended_at - timedelta(seconds=duration or 0.0),
        finished=ended_at,
        duration=duration,
        status_code=result.status_code if result is not None else None,
        error=outcome.error,
        throttled=outcome.decision.throttle,
        retry_after=kept.get("retry-after", "")[:RETRY_AFTER_CHARS],
        retry_in=outcome.retry_after if kind not in Call.FINAL else None,
        throttle_headers=kept,
    )


def throttle_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The response headers the limiter reads (Retry-After, X-RateLimit-*, RateLimit, the
    vendors'), by lower-case name: the same test as the limiter's, so an attempt shows what
    the throttle decision was made on and nothing else a response carries (cookies, tokens)."""
    kept: dict[str, str] = {}
    for name, value in headers.items():
        key = str(name).lower()
        if is_hint_field(key):
            kept[key] = str(value)[:THROTTLE_HEADER_CHARS]
            if len(kept) >= THROTTLE_HEADERS_KEPT:
                break
    return kept


def _throttle_events(call: Call, outcome: Outcome, events: list[ThrottleEvent]) -> list[str]:
    """Append the throttle events of one outcome to `events`; returns their kinds."""
    feedback, result = outcome.feedback, outcome.result
    if result is None or feedback is None:
        return []
    common = {"api_id": call.job.api_id, "job_id": call.job_id, "call_id": call.pk}
    added = []
    if outcome.decision.throttle:
        added.append(
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
        added.append(
            ThrottleEvent(
                kind=ThrottleEvent.Kind.QUOTA_EXHAUSTED,
                status_code=result.status_code,
                retry_after=feedback.blocked_for,
                **common,
            )
        )
    if feedback.rate_decreased:
        added.append(
            ThrottleEvent(
                kind=ThrottleEvent.Kind.RATE_DECREASED,
                rate_before=feedback.rate_before,
                rate_after=feedback.rate_after,
                **common,
            )
        )
    events.extend(added)
    return [str(event.kind) for event in added]


def _log_throttle_decision(call: Call, outcome: Outcome, kinds: list[str]) -> None:
    """One INFO line per response that changed the shared limiter: what the API said and what
    every worker now does about it."""
    feedback, result = outcome.feedback, outcome.result
    # The bucket it changed: the API's own, or one customer's key's (keys are not secrets).
    key = call_credential_key(call, call.job)
    fields = {
        "api": call.job.api.name,
        "credential_key": key,
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
        "throttle decision: api=%(api)s" + (" key=%(credential_key)s" if key else "") + " "
        "job=%(job_id)s call=%(call_id)s status=%(status_code)s "
        "events=%(events)s blocked_for=%(blocked_for).3fs rate=%(rate_before).3f->"
        "%(rate_after).3f outcome=%(outcome)s retry_in=%(retry_in).3fs",
        fields,
        extra=fields,
    )
