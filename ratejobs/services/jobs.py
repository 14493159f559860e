"""Writes on jobs: create with validated calls, pause, resume, cancel, retry failed."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Count, F, Min, QuerySet, Sum
from django.utils import timezone

from ratejobs.execution.request import merge_headers
from ratejobs.execution.targets import check_headers, resolve_url, validate_method
from ratejobs.infra.clock import database_now
from ratejobs.infra.wakeups import request_dispatch
from ratejobs.limiter.config import MAX_COST
from ratejobs.models import Api, Call, Job, JobPause, JobSecond
from ratejobs.permissions import can_submit_to
from ratejobs.services.callbacks import (
    callback_fields_on_finish,
    callback_url_check,
    job_callback_prepare,
    job_callback_supersede,
)
from ratejobs.services.credentials import (
    check_credential_key,
    missing_credential_keys,
    missing_keys_error,
)

logger = logging.getLogger(__name__)

CALL_FIELDS = {"method", "path", "query", "headers", "json", "body", "cost", "credential_key"}
# The text columns a call spec fills and their lengths, checked before the database does: a
# value too long is a 400 naming the field, not PostgreSQL's DataError (a 500) or SQLite
# storing it whole. (method and credential_key have shapes that fit today's columns; checked
# all the same.) The job's own columns are held by Job.full_clean in job_submit.
BOUNDED_CALL_FIELDS = {
    name: Call._meta.get_field(name).max_length for name in ("method", "path", "credential_key")
}
# Rows per INSERT: large enough to be fast, small enough for SQLite's variable limit.
BULK_BATCH = 2000
# A job at least this large refreshes the planner's statistics of the calls table once stored.
ANALYZE_AFTER_CALLS = 20_000
# ... and bytes: calls waiting in a batch are Python objects, several times larger than their
# JSON (a JSON body of empty arrays takes about 20 times its size), so a batch of large calls
# is written out early to keep a request's memory in the tens of MiB.
BULK_BATCH_BYTES = 2 * 1024 * 1024


class CallsInvalid(ValidationError):
    """Calls that failed validation: `call_errors` maps a call's index to its field errors.

    Django's ValidationError cannot hold a dict inside a dict, so its own messages stay flat
    ("call 3: path: ...") and the structure rides beside them (the REST API returns it)."""

    def __init__(self, call_errors: dict[int, dict[str, list[str]]]) -> None:
        self.call_errors = call_errors
        super().__init__({"calls": self.messages_by(lambda index: f"call {index}")})

    def messages_by(self, where: Callable[[int], str]) -> list[str]:
        """One message per error, each starting with where(call index): "call 3", "line 5"."""
        return [
            f"{where(index)}: {message}"
            if field == NON_FIELD_ERRORS
            else f"{where(index)}: {field}: {message}"
            for index, fields in self.call_errors.items()
            for field, messages in fields.items()
            for message in messages
        ]


def call_fields_from_spec(*, api: Api, spec: Any) -> dict[str, Any]:
    """Validate one call as given by a client; raise ValidationError naming the bad fields."""
    return _call_fields_and_weight(api=api, spec=spec)[0]


def _call_fields_and_weight(*, api: Api, spec: Any) -> tuple[dict[str, Any], int]:
    """The call's fields and roughly how many bytes it takes serialized (its URL, headers and
    body), so a batch of calls can be bounded in bytes as well as in rows."""
    if not isinstance(spec, Mapping):
        raise ValidationError("each call must be an object")
    errors: dict[str, str] = {}
    unknown = set(spec) - CALL_FIELDS
    if unknown:
        errors["fields"] = f"unknown fields: {', '.join(sorted(map(str, unknown)))}"
    method, path = spec.get("method", "GET"), spec.get("path")
    query, headers = spec.get("query"), spec.get("headers")
    body_json, body = spec.get("json"), spec.get("body")
    try:
        method = validate_method(method if isinstance(method, str) else "")
    except ValueError as exc:
        errors["method"] = str(exc)
    if not isinstance(path, str) or not path:
        errors["path"] = "a path relative to the API's base URL is required"
    for name, most in BOUNDED_CALL_FIELDS.items():
        if name not in errors and isinstance(spec.get(name), str) and len(spec[name]) > most:
            errors[name] = f"at most {most:,} characters (it has {len(spec[name]):,})"
    if query is not None and not (
        isinstance(query, Mapping)
        and all(isinstance(v, str | int | float | bool | list) for v in query.values())
    ):
        errors["query"] = "must be an object of names to values"
    header_bytes = 0
    if headers is not None:
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            errors["headers"] = "must be an object of header names to string values"
        else:
            try:  # as they will be sent: under the API's default headers
                check_headers(
                    merge_headers(api.default_headers, headers), protected={api.auth_header}
                )
            except ValueError as exc:
                errors["headers"] = str(exc)
            header_bytes = sum(len(k) + len(v) for k, v in headers.items())
    if body_json is not None and body is not None:
        errors["body"] = "give json or body, not both"
    elif body is not None and not isinstance(body, str):
        errors["body"] = "must be a string (use json for structured bodies)"
    # PostgreSQL's text and jsonb cannot hold a NUL character (the insert would fail)
    for field, value in (("query", query), ("json", body_json), ("body", body)):
        if field not in errors and _holds_nul(value):
            errors[field] = "must not contain a NUL character (\\u0000)"
    url = ""
    if not errors and isinstance(path, str):
        try:
            url = resolve_url(api.base_url, path, query)
        except ValueError as exc:
            errors["path"] = str(exc)
    size = len(body.encode()) if isinstance(body, str) else 0
    if body_json is not None:
        size = len(json.dumps(body_json).encode())
    if size > settings.RATEJOBS_MAX_CALL_BODY_BYTES:
        errors["body"] = f"larger than {settings.RATEJOBS_MAX_CALL_BODY_BYTES} bytes"
    credential_key = spec.get("credential_key", "")
    if credential_key != "":
        try:  # that the key exists is checked for the whole job (_CredentialKeysCheck)
            check_credential_key(credential_key)
        except ValueError as exc:
            errors["credential_key"] = str(exc)
    cost = spec.get("cost", 0)
    if (problem := _cost_problem(api, cost)) is not None:
        errors["cost"] = problem
    if errors:
        raise ValidationError(errors)
    fields = {
        "method": method,
        "path": path,
        "query": dict(query) if query else None,
        "headers": dict(headers) if headers else None,
        "json": body_json,
        "body": body,
        "cost": cost,
        "credential_key": credential_key,
    }
    return fields, len(url) + header_bytes + size


def _cost_problem(api: Api, cost: Any) -> str | None:
    """Why a call's estimated cost cannot be taken, if it cannot: a whole number from 0 to the
    most one grant of the API's cost windows can hold (their smallest burst)."""
    limited = api.max_cost
    most = MAX_COST if limited is None else limited
    if isinstance(cost, int) and not isinstance(cost, bool) and 0 <= cost <= most:
        return None
    if limited is None:
        return f"must be a whole number from 0 to {MAX_COST:,}"
    return (
        f"must be a whole number from 0 to {most:,}: the smallest burst of the API's cost "
        "windows, the most one call can ever be granted"
    )


def _holds_nul(value: Any) -> bool:
    """Whether a NUL character is in the JSON value, its object keys included."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_holds_nul(key) or _holds_nul(item) for key, item in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(item) for item in value)
    return False


# Jobs that still hold calls to send, and count against their owner's limits.
UNFINISHED = (Job.Status.QUEUED, Job.Status.RUNNING, Job.Status.PAUSED)
# Namespace of the PostgreSQL advisory locks that serialize one owner's job creations, so that
# two concurrent requests cannot both pass the owner's limits (any constant unused elsewhere).
OWNER_LOCK_NAMESPACE = 0x6A6F6273  # "jobs"


def job_create(**fields: Any) -> Job:
    """job_submit() (same keyword arguments) for callers that need not tell a new job from a
    replayed one."""
    job, _ = job_submit(**fields)
    return job


def job_submit(
    *,
    owner: Any,
    api: Api,
    name: str,
    calls: Iterable[Any],
    priority: int = 1,
    idempotency_key: str | None = None,
    max_calls: int | None = None,
    not_before: datetime | None = None,
    deadline: datetime | None = None,
    credential_key: str = "",
    callback_url: str = "",
) -> tuple[Job, bool]:
    """Store a job and all its calls, or nothing: one transaction, rolled back on the first
    invalid call (after collecting a few more errors) or when `calls` itself raises. Returns
    the job and whether it was made now (False: a replay of its idempotency key).

    `calls` is consumed once and stored in batches, so an upload of a million rows never sits
    in memory whole. With an idempotency key, a retry of the same request returns the job made
    the first time, also when the retries run at once: the key is checked again under the
    owner's lock, before the owner's limits (which the first job may have just reached).

    The owner's limits hold for every way in (REST, admin, command line): at most
    RATEJOBS_MAX_ACTIVE_JOBS_PER_USER unfinished jobs, at most
    RATEJOBS_MAX_PENDING_CALLS_PER_USER calls not yet final over them, and at most `max_calls`
    calls in this job (RATEJOBS_MAX_CALLS_PER_REQUEST when not given).

    `not_before`: no call is sent before then. `deadline`: calls not started by then are
    cancelled with that reason; it must be in the future, and after not_before.

    `callback_url`: the job's summary is POSTed there, signed, each time it finishes
    (services.callbacks); the owner needs a signing key.
    """
    replayed = _job_with_key(owner, idempotency_key)
    if replayed is not None:
        return replayed, False
    if not can_submit_to(owner, api):
        raise PermissionDenied(
            f"You may not submit jobs to the API {api.name!r}: it takes jobs only from the "
            "members of its submitter groups."
        )
    _check_schedule(not_before, deadline)
    callback_url_check(owner=owner, url=callback_url)
    job = Job(owner=owner, api=api, name=name, priority=priority, idempotency_key=idempotency_key,
              not_before=not_before, deadline=deadline,
              credential_key=credential_key)  # fmt: skip
    job.callback_url = callback_url
    job.full_clean(exclude=["owner", "api", "idempotency_key"])
    if credential_key and missing_credential_keys(api=api, keys=[credential_key]):
        raise missing_keys_error(api, [credential_key])
    try:
        with transaction.atomic():
            _lock_owner(owner)
            replayed = _job_with_key(owner, idempotency_key)
            if replayed is not None:  # a concurrent request with the key committed first
                return replayed, False
            allowed = _calls_allowed(owner, max_calls)
            job.dispatch_pass = _lowest_active_pass(api.pk)
            job.save()
            job.total = _store_calls(job, calls, allowed)
            Job.objects.filter(pk=job.pk).update(total=job.total)
            # a new job's first calls go at once; finished calls share debounced runs
            transaction.on_commit(lambda: request_dispatch(api.pk, countdown=0))
            if job.total >= ANALYZE_AFTER_CALLS:
                transaction.on_commit(_analyze_calls)
    except IntegrityError:
        if idempotency_key:  # the same, where the owner's lock is not a database lock
            return Job.objects.get(owner=owner, idempotency_key=idempotency_key), False
        raise
    return job, True


def _check_schedule(not_before: datetime | None, deadline: datetime | None) -> None:
    errors = {}
    for name, value in (("not_before", not_before), ("deadline", deadline)):
        if value is not None and timezone.is_naive(value):
            errors[name] = "give a time zone (e.g. 2026-12-01T08:00:00Z)"
    if not errors and deadline is not None:
        if deadline <= timezone.now():
            errors["deadline"] = "the deadline has passed already"
        elif not_before is not None and deadline <= not_before:
            errors["deadline"] = "the deadline must come after not_before"
    if errors:
        raise ValidationError(errors)


def _job_with_key(owner: Any, idempotency_key: str | None) -> Job | None:
    if not idempotency_key:
        return None
    return Job.objects.filter(owner=owner, idempotency_key=idempotency_key).first()


def _analyze_calls() -> None:
    """Refresh PostgreSQL's statistics of the calls table after a large upload, without
    waiting for autovacuum (which may be off, or a minute behind): with none, the planner took
    the partial index of undispatched calls for a few rows, and each dispatch reads every call
    of a large new job."""
    if connection.vendor != "postgresql":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(Call._meta.db_table)}")
    except DatabaseError:
        logger.warning("could not ANALYZE the calls table after a large upload", exc_info=True)


def _lock_owner(owner: Any) -> None:
    """Serialize the owner's job creations until the transaction ends. PostgreSQL takes an
    advisory lock (the user's row stays free for logins); SQLite runs one writing transaction
    at a time anyway (IMMEDIATE transactions, see settings)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [OWNER_LOCK_NAMESPACE, int(owner.pk)]
            )


@dataclass(frozen=True)
class _CallsAllowed:
    """How many calls the new job may hold, and the message when it has more."""

    most: int
    refusal: str


def _calls_allowed(owner: Any, max_calls: int | None) -> _CallsAllowed:
    """Check the owner's unfinished jobs against the limits; how many calls the job may have."""
    max_jobs = settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER
    max_pending = settings.RATEJOBS_MAX_PENDING_CALLS_PER_USER
    unfinished = Job.objects.filter(owner=owner, status__in=UNFINISHED).aggregate(
        jobs=Count("pk"),
        pending=Sum(F("total") - F("succeeded") - F("failed") - F("cancelled")),
    )
    if unfinished["jobs"] >= max_jobs:
        raise ValidationError(
            f"You have {unfinished['jobs']} unfinished jobs (queued, running or paused); the "
            f"limit is {max_jobs} per user (RATEJOBS_MAX_ACTIVE_JOBS_PER_USER). Wait for some "
            "to finish, or cancel them."
        )
    per_job = settings.RATEJOBS_MAX_CALLS_PER_REQUEST if max_calls is None else max_calls
    room = max_pending - (unfinished["pending"] or 0)
    if room < per_job:
        return _CallsAllowed(
            most=max(room, 0),
            refusal=f"your unfinished jobs already hold {unfinished['pending'] or 0} calls not "
            f"yet sent; the limit is {max_pending} per user "
            "(RATEJOBS_MAX_PENDING_CALLS_PER_USER), so this job may have at most "
            f"{max(room, 0)} calls",
        )
    return _CallsAllowed(most=per_job, refusal=f"at most {per_job} calls per job")


def calls_check(*, api: Api, calls: Iterable[Any]) -> None:
    """Raise what job_submit would for these calls (CallsInvalid naming bad ones by index),
    storing nothing: an idempotent replay must still be a job the first request could be."""
    for _ in _checked_calls(api, calls, allowed=None):
        pass


def _store_calls(job: Job, calls: Iterable[Any], allowed: _CallsAllowed) -> int:
    """Validate and insert the calls in batches; raise (and store nothing) if any is bad."""
    batch: list[Call] = []
    batch_bytes = 0
    total = 0
    for index, fields, weight in _checked_calls(job.api, calls, allowed):
        total = index + 1
        fields["index"] = index
        batch.append(fields)
        batch_bytes += weight
        if len(batch) >= BULK_BATCH or batch_bytes >= BULK_BATCH_BYTES:
            _insert_calls(job, batch)
            batch, batch_bytes = [], 0
    _insert_calls(job, batch)
    return total


def _checked_calls(
    api: Api, calls: Iterable[Any], allowed: _CallsAllowed | None
) -> Iterator[tuple[int, dict[str, Any], int]]:
    """Each call's index, fields and weight while every call so far is good; raises at the end
    if any was bad (after a few more errors) or there was none."""
    errors: dict[int, dict[str, list[str]]] = {}
    total = 0
    keys = _CredentialKeysCheck(api)
    for index, spec in enumerate(calls):
        if allowed is not None and index >= allowed.most:
            raise ValidationError({"calls": allowed.refusal})
        total = index + 1
        try:
            fields, weight = _call_fields_and_weight(api=api, spec=spec)
        except ValidationError as exc:
            errors[index] = (
                exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
            )
            if len(errors) >= 20:  # enough to fix a systematic mistake without a huge reply
                break
            continue
        if not errors:  # after a bad call nothing more is stored; the rest is only checked
            keys.add(fields["credential_key"])
            yield index, fields, weight
    if errors:
        raise CallsInvalid(errors)
    if not total:
        raise ValidationError({"calls": "a job needs at least one call"})
    keys.finish()


class _CredentialKeysCheck:
    """That every credential key the calls name exists for the API, looked up a thousand
    distinct keys at a time while the calls stream by; finish() raises naming the first
    missing ones (the job's transaction then stores nothing)."""

    BATCH = 1000

    def __init__(self, api: Api) -> None:
        self.api = api
        self.seen: set[str] = set()
        self.pending: list[str] = []
        self.missing: list[str] = []

    def add(self, key: str) -> None:
        if key and key not in self.seen:
            self.seen.add(key)
            self.pending.append(key)
            if len(self.pending) >= self.BATCH:
                self._look_up()

    def _look_up(self) -> None:
        self.missing += missing_credential_keys(api=self.api, keys=self.pending)
        self.pending = []

    def finish(self) -> None:
        self._look_up()
        if self.missing:
            raise missing_keys_error(self.api, self.missing)


# The fields a submitted call sets (call_fields_from_spec, plus its index); JSON ones are
# written as JSON text.
SUBMITTED_FIELDS = (
    "index", "method", "path", "query", "headers", "json", "body", "cost", "credential_key",
)  # fmt: skip
SUBMITTED_JSON_FIELDS = frozenset({"query", "headers", "json"})


def _insert_calls(job: Job, calls: list[dict[str, Any]]) -> None:
    """On PostgreSQL, COPY: an INSERT of 2,000 rows has 50,000 parameters, and building and
    binding it took most of job_create's time (a 100,000-call upload took over a minute).
    The columns a submission does not set are worked out once per batch, not per row."""
    if not calls:
        return
    if connection.vendor != "postgresql":
        Call.objects.bulk_create(Call(job=job, **fields) for fields in calls)
        return
    template = Call(job=job, index=0, method="GET", path="/")
    fields = [field for field in Call._meta.concrete_fields if not field.primary_key]
    given = [field.name in SUBMITTED_FIELDS for field in fields]
    shared = [
        None if is_given else field.get_db_prep_save(field.pre_save(template, add=True), connection)
        for field, is_given in zip(fields, given, strict=True)
    ]
    plan = [
        (field.name, field.name in SUBMITTED_JSON_FIELDS, is_given, value)
        for field, is_given, value in zip(fields, given, shared, strict=True)
    ]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(field.column) for field in fields)
    # names come from the model, never from input; the rows go as COPY data
    statement = f"COPY {quote(Call._meta.db_table)} ({columns}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        for call in calls:
            copy.write_row(
                [
                    (_json_text(call[name]) if is_json else call[name]) if is_given else value
                    for name, is_json, is_given, value in plan
                ]
            )


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def job_seconds_add(ended: dict[int, int], at: datetime) -> None:
    """Add calls that ended at `at` to their jobs' JobSecond rows (job id -> calls), one
    statement per job, in the caller's transaction."""
    ended = {job_id: n for job_id, n in ended.items() if n}
    if not ended:
        return
    table = connection.ops.quote_name(JobSecond._meta.db_table)
    second = JobSecond._meta.get_field("at").get_db_prep_value(
        at.replace(microsecond=0), connection
    )
    # names come from the model, never from input; values go as parameters
    sql = (
        f"INSERT INTO {table} (job_id, at, calls) VALUES (%s, %s, %s) "  # noqa: S608
        f"ON CONFLICT (job_id, at) DO UPDATE SET calls = {table}.calls + EXCLUDED.calls"
    )
    with connection.cursor() as cursor:
        cursor.executemany(sql, [(job_id, second, n) for job_id, n in sorted(ended.items())])


def job_lock(job_id: int) -> str | None:
    """Lock the job's row and return its status (None if it is gone). Every transaction that
    writes a job and its calls takes this lock first, so they cannot deadlock each other."""
    return (
        Job.objects.select_for_update().filter(pk=job_id).values_list("status", flat=True).first()
    )


def job_complete_if_done(*, job_id: int) -> bool:
    """Mark the job completed once every call is final (counters move with the calls); a job
    with a callback_url gets its delivery in the same statement, its body in the same
    transaction, and is sent once this commits."""
    # no savepoint: writing outcomes calls this for each of its jobs, inside its transaction
    with transaction.atomic(savepoint=False):
        # On the database's clock, as its calls' `finished`: on the worker's, a job finished
        # by a host 30 s fast ended 30 s after its last call (bench/scale).
        now = database_now()
        completed = bool(
            Job.objects.filter(
                pk=job_id,
                status__in=(Job.Status.QUEUED, Job.Status.RUNNING, Job.Status.PAUSED),
                total=F("succeeded") + F("failed") + F("cancelled"),
            ).update(status=Job.Status.COMPLETED, finished=now, **callback_fields_on_finish())
        )
        if completed:
            # a paused job completes when its deadline cancels what was left
            _pause_close(job_id=job_id, now=now)
            job_callback_prepare(job_id=job_id)
    return completed


@transaction.atomic
def job_pause(*, job: Job) -> Job:
    """Stop dispatching; calls already in the broker are skipped when a worker takes them. The
    pause is recorded (JobPause) with the status change."""
    # The UPDATE holds the job's row until commit: a second pause waits, then finds the job
    # paused and opens nothing.
    updated = Job.objects.filter(pk=job.pk, status__in=Job.ACTIVE).update(status=Job.Status.PAUSED)
    if updated:
        JobPause.objects.create(job_id=job.pk, started=database_now())
        job.calls.filter(status=Call.Status.PENDING).update(dispatched_at=None)
    job.refresh_from_db()
    return job


@transaction.atomic
def job_resume(*, job: Job) -> Job:
    updated = Job.objects.filter(pk=job.pk, status=Job.Status.PAUSED).update(
        status=Job.Status.RUNNING
    )
    if updated:
        _pause_close(job_id=job.pk, now=database_now())
        _rejoin_fairly(job)
        transaction.on_commit(lambda: request_dispatch(job.api_id))
    job.refresh_from_db()
    return job


@transaction.atomic
def job_cancel(*, job: Job) -> Job:
    """Cancel every call not yet started; calls running now finish and are recorded. A pause
    still open ends at the cancel."""
    # The database's clock, as the pause's start was read: its end and the job's finish are
    # the same moment, never a pause ending after the job did.
    now = database_now()
    locked = Job.objects.select_for_update().get(pk=job.pk)
    if locked.status in (Job.Status.CANCELLED, Job.Status.COMPLETED):
        return locked
    Job.objects.filter(pk=job.pk).update(
        status=Job.Status.CANCELLED, finished=now, **callback_fields_on_finish()
    )
    _pause_close(job_id=job.pk, now=now)
    _cancel_pending_calls(job_id=job.pk, now=now)
    job_callback_prepare(job_id=job.pk)
    locked.refresh_from_db()
    return locked


def _pause_close(*, job_id: int, now: datetime) -> None:
    """End the job's open pause, if any, at `now`, and add the part of it after the job started
    to the job's paused_seconds; the caller holds the job's row."""
    pause = JobPause.objects.filter(job_id=job_id, ended__isnull=True).first()
    if pause is None:
        return
    JobPause.objects.filter(pk=pause.pk).update(ended=now)
    started = Job.objects.filter(pk=job_id).values_list("started", flat=True).first()
    if started is None:  # paused while queued: not part of a run that has not begun
        return
    seconds = (now - max(pause.started, started)).total_seconds()
    if seconds > 0:
        Job.objects.filter(pk=job_id).update(paused_seconds=F("paused_seconds") + seconds)


def job_cancel_leftovers() -> int:
    """Cancel calls that became pending again in a cancelled job (taken back from a worker
    that died mid-call) so that every call of the job is final; returns how many."""
    jobs = Job.objects.filter(status=Job.Status.CANCELLED, calls__status=Call.Status.PENDING)
    return _cancel_pending_in(jobs, now=database_now(), reason=lambda deadline: "")


def jobs_cancel_past_deadline() -> int:
    """Cancel the calls not started by their job's deadline (pending, in the broker or not),
    with that reason; calls running now finish. Returns how many were cancelled."""
    now = database_now()
    jobs = Job.objects.filter(
        deadline__lte=now,
        status__in=(*Job.ACTIVE, Job.Status.PAUSED),
        calls__status=Call.Status.PENDING,
    )
    return _cancel_pending_in(
        jobs,
        now=now,
        reason=lambda deadline: f"not started by the job's deadline ({deadline.isoformat()})",
    )


def _cancel_pending_in(
    jobs: QuerySet[Job], *, now: datetime, reason: Callable[[datetime | None], str]
) -> int:
    """Cancel the pending calls of `jobs` (a query joined to their pending calls), one job per
    transaction under its lock, with reason(job's deadline) as their error; then complete each
    job that has nothing left to run."""
    cancelled = 0
    for job_id, deadline in list(jobs.values_list("pk", "deadline").distinct()):
        with transaction.atomic():
            job_lock(job_id)
            cancelled += _cancel_pending_calls(job_id=job_id, now=now, error=reason(deadline))
        job_complete_if_done(job_id=job_id)
    return cancelled


def _cancel_pending_calls(*, job_id: int, now, error: str = "") -> int:
    """Cancel and count the job's pending calls; the caller holds the job's row lock."""
    reason = {"error": error} if error else {}
    cancelled = Call.objects.filter(job_id=job_id, status=Call.Status.PENDING).update(
        status=Call.Status.CANCELLED,
        finished=now,
        dispatched_at=None,
        next_attempt_at=None,
        **reason,
    )
    if cancelled:
        Job.objects.filter(pk=job_id).update(cancelled=F("cancelled") + cancelled)
    return cancelled


@transaction.atomic
def job_retry_failed(*, job: Job) -> Job:
    """Put failed calls back to pending with fresh attempts; the job runs again."""
    locked = Job.objects.select_for_update().get(pk=job.pk)
    if locked.status == Job.Status.CANCELLED:
        raise ValidationError("a cancelled job cannot be retried")
    again = locked.calls.filter(status=Call.Status.FAILED).update(
        status=Call.Status.PENDING,
        attempts=0,
        throttled_count=0,
        next_attempt_at=None,
        dispatched_at=None,
        finished=None,
        error="",
    )
    if again:
        new_status = Job.Status.PAUSED if locked.status == Job.Status.PAUSED else Job.Status.RUNNING
        # bodies_removed_at: once it finishes again, retention looks at the job's calls again
        Job.objects.filter(pk=job.pk).update(
            failed=F("failed") - again, status=new_status, finished=None, bodies_removed_at=None
        )
        job_callback_supersede(job_id=job.pk)
        _rejoin_fairly(locked)
        transaction.on_commit(lambda: request_dispatch(job.api_id))
    locked.refresh_from_db()
    return locked


def _rejoin_fairly(job: Job) -> None:
    """A job coming back must not claim the share it missed while away: start it at the lowest
    pass among the API's running jobs (stride scheduling)."""
    Job.objects.filter(pk=job.pk).update(dispatch_pass=_lowest_active_pass(job.api_id))


def _lowest_active_pass(api_id: int) -> float:
    lowest = Job.objects.filter(api_id=api_id, status__in=Job.ACTIVE).aggregate(
        lowest=Min("dispatch_pass")
    )["lowest"]
    return lowest or 0.0


class JobActionRefused(Exception):
    """The job's status rules the action out; the message says why, for a person to read."""

    def __init__(self, job: Job, message: str) -> None:
        super().__init__(message)
        self.job = job


def job_action_refusal(job: Job, action: str) -> str | None:
    """Why the job's status, as loaded, rules the action out; None when it is allowed."""
    status = job.status
    if action == "pause" and status not in Job.ACTIVE:
        return f"Cannot pause a {status} job; only queued or running jobs."
    if action == "resume" and status != Job.Status.PAUSED:
        return f"Cannot resume a {status} job; only paused jobs."
    if action == "cancel" and status in (Job.Status.CANCELLED, Job.Status.COMPLETED):
        return f"Cannot cancel a {status} job."
    if action == "retry-failed":
        if status == Job.Status.CANCELLED:
            return "Cannot retry a cancelled job."
        if not job.failed:
            return "The job has no failed calls to retry."
    return None


def job_actions_allowed(job: Job) -> list[str]:
    """The JOB_ACTIONS a person may take on the job as it stands, in their usual order."""
    return [action for action in JOB_ACTIONS if job_action_refusal(job, action) is None]


def _pause(job: Job) -> Job:
    job = job_pause(job=job)
    if job.status != Job.Status.PAUSED:  # it finished or was cancelled meanwhile
        raise JobActionRefused(job, f"Cannot pause a {job.status} job.")
    return job


def _resume(job: Job) -> Job:
    job = job_resume(job=job)
    if job.status != Job.Status.RUNNING:
        raise JobActionRefused(job, f"Cannot resume a {job.status} job.")
    return job


def _cancel(job: Job) -> Job:
    job = job_cancel(job=job)
    if job.status != Job.Status.CANCELLED:
        raise JobActionRefused(job, f"Cannot cancel a {job.status} job.")
    return job


def _retry_failed(job: Job) -> Job:
    try:
        return job_retry_failed(job=job)
    except ValidationError as exc:  # cancelled meanwhile
        raise JobActionRefused(job, " ".join(exc.messages)) from exc


# What people may do to a job, by the name the REST API and the admin use.
JOB_ACTIONS = {
    "pause": _pause,
    "resume": _resume,
    "cancel": _cancel,
    "retry-failed": _retry_failed,
}


def job_act(*, job: Job, action: str) -> Job:
    """Apply one of JOB_ACTIONS; JobActionRefused when the job's status rules it out."""
    refusal = job_action_refusal(job, action)
    if refusal is not None:
        raise JobActionRefused(job, refusal)
    return JOB_ACTIONS[action](job)


# --- running a job again (a clone) -------------------------------------------------------------

# What a clone copies of a call: its request, as a client submits it (CALL_FIELDS), never its
# outcome (status, response, attempts, error, its limiter reservation).
CLONED_CALL_FIELDS = tuple(sorted(CALL_FIELDS))
# Rows of the source job read per round trip while the clone is stored.
CLONE_READ_CHUNK = 2000


class JobCloneRefused(Exception):
    """The source job's status rules the clone out (REST: 409); the message says why."""

    def __init__(self, job: Job, message: str) -> None:
        super().__init__(message)
        self.job = job


def job_clone_name(job: Job) -> str:
    """The clone's name when none is given, cut to fit the column."""
    most = Job._meta.get_field("name").max_length
    suffix = " (again)"
    return job.name[: most - len(suffix)] + suffix


def job_clone_refusal(job: Job, *, only_failed: bool) -> str | None:
    """Why the job, as loaded, cannot be cloned that way; None when it can.

    Every call may be copied whatever the job's status: a call's request never changes. Only
    its failed calls need a finished job: until then which calls failed is not settled (more
    may fail, or a retry-failed may send them again), so the clone could double-send."""
    if only_failed and job.status not in (Job.Status.COMPLETED, Job.Status.CANCELLED):
        return (
            f"Cannot run only the failed calls of a {job.status} job: wait until it finishes, "
            "or run all its calls again."
        )
    return None


def job_clone(*, job: Job, owner: Any, only_failed: bool, name: str | None = None) -> Job:
    """A new queued job of `owner` with copies of the job's calls: all of them, or with
    `only_failed` the calls that failed (status failed; cancelled calls were never sent, or
    stopped by a cancel or a deadline on purpose, and are not copied: run all again for them).

    It goes through job_submit, so it is held to what any new job is: the owner's limits, the
    API's submitter groups, the calls' checks against the API as it is now (its cost windows,
    its headers), the credential keys still existing; all of it or nothing, in one transaction.
    Copied: the API, priority, credential key (by key: no secret is read), the calls' requests
    and indexes renumbered from 0. Scheduling: not_before and deadline only while still ahead
    (a passed not_before would mean "now" anyway; a passed deadline would cancel every call at
    once), else none. The callback_url only when the owner is the job's: its receiver checks
    the signature with the job owner's signing key.

    PermissionDenied when `owner` may not see the job; JobCloneRefused when the job's status
    rules it out (job_clone_refusal); ValidationError when there is no call to copy, or the
    copy would not be a valid job now."""
    # Imported here: the selectors import nothing of the services, and keep it that way.
    from ratejobs.selectors.jobs import job_list_for_user

    if not job_list_for_user(owner).filter(pk=job.pk).exists():
        raise PermissionDenied("You may not see this job.")
    with transaction.atomic():
        if only_failed:
            # Held until the copy is stored: a retry-failed of the job (which takes the same
            # lock) cannot turn the failed calls back to pending halfway through the copy.
            status = job_lock(job.pk)
            if status is None:
                raise PermissionDenied("You may not see this job.")
            job.status = status
        refusal = job_clone_refusal(job, only_failed=only_failed)
        if refusal is not None:
            raise JobCloneRefused(job, refusal)
        calls = job.calls.order_by("index")
        if only_failed:
            calls = calls.filter(status=Call.Status.FAILED)
        if not calls.exists():
            which = "failed calls" if only_failed else "calls"
            raise ValidationError({"calls": f"The job has no {which} to run again."})
        now = timezone.now()
        return job_create(
            owner=owner,
            api=job.api,
            name=name or job_clone_name(job),
            calls=_call_specs(calls),
            priority=job.priority,
            # the largest job any route takes: the source was accepted by one of them, and the
            # owner's pending-calls limit still holds
            max_calls=max(
                settings.RATEJOBS_MAX_CALLS_PER_REQUEST, settings.RATEJOBS_MAX_CALLS_PER_UPLOAD
            ),
            not_before=job.not_before if job.not_before and job.not_before > now else None,
            deadline=job.deadline if job.deadline and job.deadline > now else None,
            credential_key=job.credential_key,
            callback_url=job.callback_url if job.owner_id == owner.pk else "",
        )


def _call_specs(calls: QuerySet[Call]) -> Iterator[dict[str, Any]]:
    """The calls as a client would submit them, read a chunk at a time by index: a
    million-call job is never in memory whole. Empty optional fields are left out, as a client
    leaves them out.

    Not QuerySet.iterator(): its server-side cursor, left open when job_submit stops reading
    (a limit reached, a bad call), is closed after the savepoint that held it was rolled back,
    and that error aborts the caller's transaction."""
    after = -1
    while True:
        chunk = list(
            calls.filter(index__gt=after).values("index", *CLONED_CALL_FIELDS)[:CLONE_READ_CHUNK]
        )
        if not chunk:
            return
        after = chunk[-1]["index"]
        for values in chunk:
            del values["index"]
            yield {field: value for field, value in values.items() if value is not None}
