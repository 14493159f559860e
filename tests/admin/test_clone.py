"""Run again from a job's admin page (ratejobs.admin.clone): the form on the page, the POST
that makes the new job and lands on its page, and whose jobs may be run again."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from ratejobs.models import Call, Job

pytestmark = pytest.mark.django_db


def clone_url(job: Job) -> str:
    return reverse("admin:ratejobs_job_clone", args=[job.pk])


def page_url(job: Job) -> str:
    return reverse("admin:ratejobs_job_change", args=[job.pk])


def said(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


@pytest.fixture
def staff_client(admin_client_for: Any, staff: Any) -> Client:
    return admin_client_for(staff)


def test_the_job_page_offers_run_again_posting_to_the_clone_url(staff_client, make_job, staff):
    job = make_job(calls=2, owner=staff)
    html = staff_client.get(page_url(job)).content.decode()
    assert f'<form id="rj-clone" method="post" action="{clone_url(job)}" hidden>' in html
    form = html.split('<form id="rj-clone"', 1)[1].split("</form>", 1)[0]
    assert 'name="csrfmiddlewaretoken"' in form
    assert 'value="all" form="rj-clone" checked' in html
    assert 'value="failed" form="rj-clone"' in html
    assert '<button type="submit" form="rj-clone"' in html


def test_the_post_makes_the_new_job_and_goes_to_its_page(staff_client, make_job, staff):
    job = make_job(calls=3, owner=staff, priority=5)
    response = staff_client.post(clone_url(job), {"calls": "all"})
    clone = Job.objects.exclude(pk=job.pk).get(owner=staff)
    assert response.status_code == 302 and response.headers["Location"] == page_url(clone)
    assert (clone.total, clone.priority, clone.status) == (3, 5, "queued")
    assert said(response) == [
        "Job “a job (again)” made to run the calls of “a job” again: 3 calls."
    ]


def test_only_the_failed_calls_of_a_finished_job(staff_client, make_job, staff):
    job = make_job(calls=3, owner=staff)
    Call.objects.filter(job=job).update(status=Call.Status.SUCCEEDED)
    Call.objects.filter(job=job, index=2).update(status=Call.Status.FAILED)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.COMPLETED, succeeded=2, failed=1)
    response = staff_client.post(clone_url(job), {"calls": "failed"})
    clone = Job.objects.exclude(pk=job.pk).get(owner=staff)
    assert response.headers["Location"] == page_url(clone)
    assert list(clone.calls.values_list("index", "path")) == [(0, "/items/2")]


def test_a_refusal_goes_back_to_the_job_saying_why(staff_client, make_job, staff):
    job = make_job(calls=2, owner=staff)
    for data in ({"calls": "failed"}, {"calls": "nonsense"}, {}):
        response = staff_client.post(clone_url(job), data)
        assert response.status_code == 302 and response.headers["Location"] == page_url(job)
        assert said(response), data
    assert Job.objects.filter(owner=staff).count() == 1
    response = staff_client.post(clone_url(job), {"calls": "failed"}, follow=True)
    assert "wait until it finishes" in response.content.decode()


def test_a_limit_reached_is_said_on_the_job_page(staff_client, make_job, staff, settings):
    job = make_job(calls=2, owner=staff)
    settings.RATEJOBS_MAX_ACTIVE_JOBS_PER_USER = 1
    response = staff_client.post(clone_url(job), {"calls": "all"})
    assert response.headers["Location"] == page_url(job)
    assert "RATEJOBS_MAX_ACTIVE_JOBS_PER_USER" in said(response)[0]


def test_another_staff_users_job_is_refused(
    admin_client_for, make_job, staff, django_user_model, root_client, superuser
):
    other = django_user_model.objects.create_user("olga", password="pw-olga", is_staff=True)
    job = make_job(calls=2, owner=other)
    response = admin_client_for(staff).post(clone_url(job), {"calls": "all"})
    assert response.status_code == 404
    assert not Job.objects.filter(owner=staff).exists()
    # expect: a superuser, who sees every job, runs it again as a job of their own
    response = root_client.post(clone_url(job), {"calls": "all"})
    clone = Job.objects.get(owner=superuser)
    assert response.headers["Location"] == page_url(clone) and clone.total == 2


def test_a_get_is_a_405_and_a_post_without_its_csrf_token_a_403(
    staff_client, make_job, staff, admin_client_for
):
    job = make_job(calls=1, owner=staff)
    assert staff_client.get(clone_url(job)).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(staff)
    assert strict.post(clone_url(job), {"calls": "all"}).status_code == 403
    assert Job.objects.filter(owner=staff).count() == 1


def test_anonymous_goes_to_the_login_page(make_job):
    job = make_job(calls=1)
    response = Client().post(clone_url(job), {"calls": "all"})
    assert response.status_code == 302 and "/admin/login/" in response.headers["Location"]
