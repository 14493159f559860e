"""Running a job again (services.jobs.job_clone): the calls' requests copied exactly, the
failed-only selection, the owner's limits, and all of it or nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from ratejobs.models import Api, Call, Job
from ratejobs.services import jobs as jobs_service
from ratejobs.services.callbacks import signing_key_rotate
from ratejobs.services.credentials import credentials_add
from ratejobs.services.jobs import JobCloneRefused, job_cancel, job_clone, job_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("services_redis")]

HOOK = "http://127.0.0.1:9/hooks/ratejobs"
REQUEST_FIELDS = ("method", "path", "query", "headers", "json", "body", "cost", "credential_key")
SPECS = [
    {"method": "GET", "path": "/a", "query": {"q": "x", "n": 2}},
    {"method": "POST", "path": "/b", "json": {"deep": [1, {"k": None}]}, "cost": 3},
    {"method": "PUT", "path": "/c", "body": "raw text", "headers": {"X-Trace": "t1"}},
    {"method": "DELETE", "path": "/d", "credential_key": "acme"},
]


def requests_of(job: Job) -> list[tuple[Any, ...]]:
    return list(job.calls.order_by("index").values_list("index", *REQUEST_FIELDS))


def finish(job: Job, outcomes: list[str]) -> Job:
    """The job as workers leave it: each call with the given outcome and a response."""
    for call, outcome in zip(job.calls.order_by("index"), outcomes, strict=True):
        Call.objects.filter(pk=call.pk).update(
            status=outcome, status_code=500, response_body=b"their answer", attempts=3,
            error="boom", finished=timezone.now(),
        )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(
        status=Job.Status.COMPLETED,
        succeeded=outcomes.count("succeeded"),
        failed=outcomes.count("failed"),
        cancelled=outcomes.count("cancelled"),
        finished=timezone.now(),
    )
    job.refresh_from_db()
    return job


@pytest.fixture
def source(api: Api, user: Any) -> Job:
    credentials_add(api=api, items=[("acme", "secret-of-acme")])
    signing_key_rotate(user=user)
    return job_create(
        owner=user, api=api, name="nightly", calls=SPECS, priority=7, credential_key="acme",
        callback_url=HOOK,
    )  # fmt: skip


def test_every_call_is_copied_exactly_into_a_new_queued_job(source, user):
    finish(source, ["succeeded", "failed", "cancelled", "failed"])
    clone = job_clone(job=source, owner=user, only_failed=False)
    assert clone.pk != source.pk and clone.status == Job.Status.QUEUED
    assert (clone.api_id, clone.owner, clone.priority, clone.credential_key) == (
        source.api_id, user, 7, "acme",
    )  # fmt: skip
    assert clone.name == "nightly (again)" and clone.total == 4
    assert clone.callback_url == HOOK and clone.idempotency_key is None
    assert requests_of(clone) == requests_of(source)
    # expect: nothing of the first run's outcome
    assert set(clone.calls.values_list("status", "attempts", "error", "status_code")) == {
        ("pending", 0, "", None)
    }
    assert not clone.calls.exclude(response_body=None).exists()
    assert (clone.succeeded, clone.failed, clone.cancelled) == (0, 0, 0)


def test_only_failed_copies_the_failed_calls_and_no_cancelled_or_succeeded_one(source, user):
    finish(source, ["succeeded", "failed", "cancelled", "failed"])
    clone = job_clone(job=source, owner=user, only_failed=True, name="the failures")
    assert clone.name == "the failures" and clone.total == 2
    failed = [row[1:] for row in requests_of(source) if row[0] in (1, 3)]
    assert requests_of(clone) == [(0, *failed[0]), (1, *failed[1])]


def test_only_failed_needs_a_finished_job_while_all_calls_may_be_copied_at_any_time(source, user):
    Job.objects.filter(pk=source.pk).update(status=Job.Status.RUNNING, failed=1)
    Call.objects.filter(job=source, index=0).update(status=Call.Status.FAILED)
    source.refresh_from_db()
    before = Job.objects.count()
    with pytest.raises(JobCloneRefused, match="running job"):
        job_clone(job=source, owner=user, only_failed=True)
    assert Job.objects.count() == before
    assert job_clone(job=source, owner=user, only_failed=False).total == 4


def test_a_job_with_nothing_to_copy_is_refused_with_a_clear_error(source, user):
    finish(source, ["succeeded", "succeeded", "cancelled", "succeeded"])
    before = Job.objects.count()
    with pytest.raises(ValidationError) as raised:
        job_clone(job=source, owner=user, only_failed=True)
    assert raised.value.message_dict == {"calls": ["The job has no failed calls to run again."]}
    assert Job.objects.count() == before


def test_a_cancelled_job_runs_again_whole_or_its_failed_calls(source, user):
    Call.objects.filter(job=source, index=0).update(status=Call.Status.FAILED)
    Job.objects.filter(pk=source.pk).update(failed=1)
    cancelled = job_cancel(job=source)
    assert job_clone(job=cancelled, owner=user, only_failed=True).total == 1
    assert job_clone(job=cancelled, owner=user, only_failed=False).total == 4


def test_the_owners_limits_hold_for_a_clone_as_for_any_new_job(source, user, settings):
    finish(source, ["failed"] * 4)
    before = (Job.objects.count(), Call.objects.count())
    settings.RATEJOBS_MAX_PENDING_CALLS_PER_USER = 3
    with pytest.raises(ValidationError, match="RATEJOBS_MAX_PENDING_CALLS_PER_USER"):
        job_clone(job=source, owner=user, only_failed=False)
    settings.RATEJOBS_MAX_PENDING_CALLS_PER_USER = 100
    settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER = 1
    job_create(owner=user, api=source.api, name="busy", calls=[{"path": "/x"}])
    with pytest.raises(ValidationError, match="RATEJOBS_MAX_ACTIVE_JOBS_PER_USER"):
        job_clone(job=source, owner=user, only_failed=True)
    assert (Job.objects.count(), Call.objects.count()) == (before[0] + 1, before[1] + 1)


def test_nothing_is_half_stored_when_a_call_is_no_longer_valid(api, user, monkeypatch):
    # given: 7 calls, stored 2 to a batch, the last costing more than the API now allows
    specs = [{"path": f"/{i}", "cost": 5 if i == 6 else 0} for i in range(7)]
    source = job_create(owner=user, api=api, name="costly", calls=specs)
    Api.objects.filter(pk=api.pk).update(
        limits=[{"rate": 10, "period": 1, "burst": 4, "unit": "cost"}]
    )
    source = Job.objects.select_related("api").get(pk=source.pk)
    monkeypatch.setattr(jobs_service, "BULK_BATCH", 2)
    before = (Job.objects.count(), Call.objects.count())
    with pytest.raises(ValidationError) as raised:
        job_clone(job=source, owner=user, only_failed=False)
    assert "call 6: cost" in raised.value.messages[0]
    assert (Job.objects.count(), Call.objects.count()) == before


def test_a_credential_key_deleted_since_refuses_the_clone(source, user):
    source.api.credentials.filter(key="acme").delete()
    with pytest.raises(ValidationError, match="acme"):
        job_clone(job=source, owner=user, only_failed=False)


def test_a_job_the_owner_may_not_see_is_refused(source, other_user):
    before = Job.objects.count()
    with pytest.raises(PermissionDenied):
        job_clone(job=source, owner=other_user, only_failed=False)
    Job.objects.filter(pk=source.pk).update(purge_started=timezone.now())
    with pytest.raises(PermissionDenied):
        job_clone(job=source, owner=source.owner, only_failed=False)
    assert Job.objects.count() == before


def test_a_superusers_clone_is_theirs_without_the_owners_callback(source, superuser):
    clone = job_clone(job=source, owner=superuser, only_failed=False)
    assert clone.owner == superuser and clone.callback_url == "" and clone.total == 4


def test_a_schedule_is_copied_while_ahead_and_dropped_once_passed(api, user):
    now = timezone.now()
    ahead = job_create(
        owner=user, api=api, name="later", calls=[{"path": "/a"}],
        not_before=now + timedelta(hours=1), deadline=now + timedelta(hours=2),
    )  # fmt: skip
    clone = job_clone(job=ahead, owner=user, only_failed=False)
    assert (clone.not_before, clone.deadline) == (ahead.not_before, ahead.deadline)
    Job.objects.filter(pk=ahead.pk).update(
        not_before=now - timedelta(hours=2), deadline=now - timedelta(hours=1)
    )
    ahead.refresh_from_db()
    clone = job_clone(job=ahead, owner=user, only_failed=False)
    assert (clone.not_before, clone.deadline) == (None, None)


def test_a_long_name_gets_its_suffix_within_the_column(make_job: Callable[..., Job], user):
    job = make_job(calls=1, name="n" * 200)
    clone = job_clone(job=job, owner=user, only_failed=False)
    assert len(clone.name) == 200 and clone.name.endswith(" (again)")
