"""When a job runs: nothing is sent before its not_before, and calls not started by its deadline
are cancelled with that reason."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.utils import timezone

from ratejobs.models import Call, Job
from ratejobs.services.apis import api_create
from ratejobs.services.calls import calls_claim
from ratejobs.services.jobs import job_create
from ratejobs.worker.dispatch import dispatch_api
from ratejobs.worker.reconcile import reconcile
from tests.realparts import wait_for_job


def _calls(n: int) -> list[dict]:
    return [{"method": "GET", "path": f"/items/{i}"} for i in range(n)]


@pytest.mark.django_db
def test_a_job_is_not_dispatched_before_its_not_before(make_api: Any, user: Any) -> None:
    api = make_api()
    not_before = timezone.now() + timedelta(seconds=1.5)
    job = job_create(owner=user, api=api, name="later", calls=_calls(3), not_before=not_before)
    # expect: nothing dispatched yet, and a wake-up asked for at not_before
    result = dispatch_api(api_id=api.pk)
    assert (result.dispatched, result.next_due) == (0, not_before)
    time.sleep(max(0.0, (not_before - timezone.now()).total_seconds()) + 0.2)
    assert dispatch_api(api_id=api.pk).dispatched == 3
    assert Job.objects.get(pk=job.pk).status == "running"


@pytest.mark.django_db
def test_calls_not_started_by_the_deadline_are_cancelled_with_that_reason(
    make_api: Any, user: Any, services_redis: None
) -> None:
    # given a job whose calls are in the broker when its deadline passes
    api = make_api()
    deadline = timezone.now() + timedelta(seconds=1)
    job = job_create(owner=user, api=api, name="urgent", calls=_calls(3), deadline=deadline)
    assert dispatch_api(api_id=api.pk).dispatched == 3
    time.sleep(max(0.0, (deadline - timezone.now()).total_seconds()) + 0.2)
    # expect: a worker claims none of them, and the reconciler cancels them, saying why
    call_ids = list(Call.objects.filter(job=job).values_list("pk", flat=True))
    assert calls_claim(job_id=job.pk, call_ids=call_ids, owner="w") == []
    assert dispatch_api(api_id=api.pk).dispatched == 0
    reconcile()
    job.refresh_from_db()
    assert (job.status, job.cancelled, job.succeeded) == ("completed", 3, 0)
    errors = set(Call.objects.filter(job=job).values_list("status", "error"))
    assert errors == {("cancelled", f"not started by the job's deadline ({deadline.isoformat()})")}


@pytest.mark.django_db
def test_a_deadline_in_the_past_or_before_not_before_is_refused(make_api: Any, user: Any) -> None:
    api = make_api()
    now = timezone.now()
    with pytest.raises(ValidationError, match="passed already"):
        job_create(owner=user, api=api, name="x", calls=_calls(1), deadline=now)
    with pytest.raises(ValidationError, match="after not_before"):
        later, sooner = now + timedelta(hours=2), now + timedelta(hours=1)
        job_create(owner=user, api=api, name="x", calls=[], not_before=later, deadline=sooner)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_rest_api_takes_and_shows_the_schedule(
    client_for: Any,
    user: Any,
    make_api: Any,
    services_redis: None,
    throttles_in_the_test_redis: None,
) -> None:
    api = make_api()
    client = client_for(user)
    payload = {"api": api.name, "name": "s", "calls": _calls(1)}
    late = {**payload, "not_before": "2099-01-01T08:00:00Z", "deadline": "2099-01-01T09:00:00Z"}
    response = client.post("/api/jobs/", late, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["not_before"], response.json()["deadline"]) == (
        "2099-01-01T08:00:00Z",
        "2099-01-01T09:00:00Z",
    )
    past = client.post("/api/jobs/", {**payload, "deadline": "2001-01-01T00:00:00Z"}, format="json")
    assert past.status_code == 400
    assert "passed already" in past.json()["deadline"][0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
def test_real_workers_send_nothing_before_not_before(
    sandbox: Any, start_worker: Any, unique_name: str
) -> None:
    owner = get_user_model().objects.create_user("owner", password="x")
    server = sandbox(rate=100, burst=10, headers="none")
    api = api_create(name=unique_name, base_url=server.url, rate=50, burst=5)
    start_worker(concurrency=2)
    not_before = timezone.now() + timedelta(seconds=3)
    job = job_create(owner=owner, api=api, name="at 3 s", calls=_calls(20), not_before=not_before)
    job = wait_for_job(job, timeout=60)
    arrivals = [entry["t"] for entry in server.stats(detail=True)["log"]]
    assert job.succeeded == 20 and len(arrivals) == 20
    assert min(arrivals) >= not_before.timestamp()


@pytest.mark.django_db
def test_the_command_line_and_the_admin_take_the_schedule(
    make_api: Any, superuser: Any, admin_client_for: Any, tmp_path: Any, services_redis: None
) -> None:
    import io

    from django.core.management import call_command

    api = make_api()
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n')
    out = io.StringIO()
    call_command("submit_job", "--api", api.name, "--file", str(calls), "--owner",
                 superuser.username, "--not-before", "2099-01-01T08:00Z",
                 "--deadline", "2099-01-01T09:00+00:00", stdout=out)  # fmt: skip
    job = Job.objects.get()
    assert (job.not_before.isoformat(), job.deadline.isoformat()) == (
        "2099-01-01T08:00:00+00:00",
        "2099-01-01T09:00:00+00:00",
    )
    with pytest.raises(Exception, match="no time zone"):
        call_command("submit_job", "--api", api.name, "--file", str(calls), "--owner",
                     superuser.username, "--deadline", "2099-01-01T09:00")  # fmt: skip
    page = admin_client_for(superuser).get(f"/admin/ratejobs/job/{job.pk}/change/")
    assert "Not before" in page.content.decode() and "Deadline" in page.content.decode()
