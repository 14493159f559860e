"""POST /api/jobs/{id}/clone/: run a job again, all its calls or its failed ones."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from ratejobs.models import Call, Job

pytestmark = pytest.mark.django_db


def url(job: Job) -> str:
    return f"/api/jobs/{job.pk}/clone/"


def completed(job: Job, failed: tuple[int, ...]) -> Job:
    """The job finished, the calls at `failed` failed and the others succeeded."""
    Call.objects.filter(job=job).update(status=Call.Status.SUCCEEDED, finished=timezone.now())
    Call.objects.filter(job=job, index__in=failed).update(status=Call.Status.FAILED)
    Job.objects.filter(pk=job.pk).update(
        status=Job.Status.COMPLETED, failed=len(failed), succeeded=job.total - len(failed)
    )
    job.refresh_from_db()
    return job


def test_all_calls_make_a_new_job_answered_as_a_job_creation_is(api_client, make_job, user):
    job = make_job(calls=3, priority=4)
    response = api_client.post(url(job), {"calls": "all"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    clone = Job.objects.get(pk=body["id"])
    assert (clone.owner, clone.total, clone.priority, clone.name) == (user, 3, 4, "a job (again)")
    assert body["status"] == "queued" and body["total"] == 3 and body["api"] == job.api.name
    created = api_client.get(f"/api/jobs/{clone.pk}/").json()
    assert set(body) == set(created)  # JobOutputSerializer, as POST /api/jobs/ answers
    paths = [c["path"] for c in api_client.get(f"/api/jobs/{clone.pk}/calls/").json()["results"]]
    assert paths == ["/items/0", "/items/1", "/items/2"]


def test_failed_calls_only_with_a_name(api_client, make_job):
    job = completed(make_job(calls=4), failed=(1, 3))
    response = api_client.post(url(job), {"calls": "failed", "name": "redo"}, format="json")
    assert response.status_code == 201, response.json()
    clone = Job.objects.get(pk=response.json()["id"])
    assert clone.name == "redo"
    assert list(clone.calls.values_list("index", "path")) == [(0, "/items/1"), (1, "/items/3")]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "calls"),
        ({"calls": "some"}, "calls"),
        ({"calls": True}, "calls"),
        ({"calls": "all", "name": "  "}, "name"),
        ({"calls": "all", "name": "n" * 201}, "name"),
        ({"calls": "all", "priority": 3}, "priority"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api_client, make_job, user, body, field):
    job = make_job(calls=1)
    response = api_client.post(url(job), body, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()
    assert Job.objects.filter(owner=user).count() == 1


def test_no_failed_call_to_copy_is_a_400(api_client, make_job, user):
    job = completed(make_job(calls=2), failed=())
    response = api_client.post(url(job), {"calls": "failed"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"calls": ["The job has no failed calls to run again."]}


def test_failed_calls_of_an_unfinished_job_are_a_409(api_client, make_job, user):
    job = make_job(calls=2)
    response = api_client.post(url(job), {"calls": "failed"}, format="json")
    assert response.status_code == 409
    assert response.json()["status"] == "queued" and "wait until it finishes" in str(
        response.json()["detail"]
    )
    assert Job.objects.filter(owner=user).count() == 1


def test_the_owners_limits_are_a_400(api_client, make_job, settings):
    job = make_job(calls=3)
    settings.RATEJOBS_MAX_PENDING_CALLS_PER_USER = 4
    response = api_client.post(url(job), {"calls": "all"}, format="json")
    assert response.status_code == 400
    assert "RATEJOBS_MAX_PENDING_CALLS_PER_USER" in str(response.json()["calls"])


def test_another_users_job_is_a_404_and_a_superuser_clones_it_as_their_own(
    client_for, make_job, other_user, superuser
):
    job = make_job(calls=2)
    theirs = client_for(other_user).post(url(job), {"calls": "all"}, format="json")
    assert theirs.status_code == 404
    assert client_for(other_user).post(url(job), {}, format="json").status_code == 404
    assert not Job.objects.filter(owner=other_user).exists()
    missing = client_for(other_user).post("/api/jobs/999999999/clone/", {"calls": "all"})
    assert missing.status_code == 404
    root = client_for(superuser).post(url(job), {"calls": "all"}, format="json")
    assert root.status_code == 201 and Job.objects.get(pk=root.json()["id"]).owner == superuser


def test_anonymous_is_a_401(client_for: Any, make_job):
    job = make_job(calls=1)
    assert client_for(None).post(url(job), {"calls": "all"}, format="json").status_code == 401
