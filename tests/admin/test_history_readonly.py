"""A job's calls and throttle events are its history: nobody adds, changes or deletes one in the
admin, superusers included (a job whose only call was deleted still read "1 succeeded, 100 %"
with a results file of its header alone). They go only with their whole job, by its purge."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.test import RequestFactory
from django.urls import resolve, reverse

from ratejobs.models import Call, Job, ThrottleEvent
from ratejobs.services.jobs import job_cancel
from ratejobs.services.retention import jobs_purge_requested


@pytest.fixture
def history(make_job: Any) -> dict[str, Any]:
    """A job of one succeeded call, and a 429 it met on the way."""
    job = make_job(calls=1, name="single")
    call = job.calls.get()
    Call.objects.filter(pk=call.pk).update(
        status="succeeded", status_code=200, attempts=2, throttled_count=1
    )
    Job.objects.filter(pk=job.pk).update(status="succeeded", succeeded=1, throttled=1)
    event = ThrottleEvent.objects.create(
        api=job.api, job=job, call=call, kind="throttled", status_code=429, retry_after=1.0
    )
    return {"job": job, "call": call, "event": event}


def pages(history: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(model name in admin URLs, the object, its rows) for the call and the event."""
    return [
        ("call", history["call"], Call.objects.filter(pk=history["call"].pk)),
        ("throttleevent", history["event"], ThrottleEvent.objects.filter(pk=history["event"].pk)),
    ]


def test_a_superuser_may_not_delete_a_call_or_an_event_by_its_delete_page(root_client, history):
    for model, obj, rows in pages(history):
        url = reverse(f"admin:ratejobs_{model}_delete", args=[obj.pk])
        assert root_client.get(url).status_code == 403, model
        assert root_client.post(url, {"post": "yes"}).status_code == 403, model
        assert rows.exists(), model
    # and the job still adds up: its one call, and its 429
    job = history["job"]
    assert job.calls.count() == 1 and job.throttle_events.count() == 1


def test_the_call_and_event_lists_offer_no_delete_action(root_client, history):
    for model, obj, rows in pages(history):
        url = reverse(f"admin:ratejobs_{model}_changelist")
        listing = root_client.get(url)
        assert listing.status_code == 200, model
        assert "delete_selected" not in listing.context["cl"].model_admin.get_actions(
            listing.wsgi_request
        )
        html = listing.content.decode()
        assert 'name="action"' not in html and "delete_selected" not in html, model
        # a bulk delete posted anyway deletes nothing
        posted = root_client.post(
            url, {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"}
        )
        assert posted.status_code == 200 and rows.exists(), model


def test_a_call_s_and_an_event_s_page_is_a_read_only_view(root_client, history):
    for model, obj, _ in pages(history):
        html = root_client.get(reverse(f"admin:ratejobs_{model}_change", args=[obj.pk]))
        assert html.status_code == 200, model
        text = html.content.decode()
        for button in ('name="_save"', 'name="_continue"', 'name="_addanother"', "deletelink"):
            assert button not in text, (model, button)
        form = text.split('id="content-main"', 1)[1].split("</form>", 1)[0]
        fields = re.findall(r"<(?:input|select|textarea)\b[^>]*>", form)
        assert all('name="csrfmiddlewaretoken"' in field for field in fields), (model, fields)


def test_a_post_to_a_call_s_or_an_event_s_page_changes_nothing(root_client, history):
    call, event = history["call"], history["event"]
    posted = root_client.post(
        reverse("admin:ratejobs_call_change", args=[call.pk]),
        {"status": "failed", "status_code": "500", "index": "7", "path": "/changed", "_save": "1"},
    )
    assert posted.status_code == 403
    call.refresh_from_db()
    assert (call.status, call.status_code, call.index, call.path) == (
        "succeeded", 200, 0, "/items/0",
    )  # fmt: skip
    posted = root_client.post(
        reverse("admin:ratejobs_throttleevent_change", args=[event.pk]),
        {"kind": "blocked", "status_code": "503", "_save": "1"},
    )
    assert posted.status_code == 403
    event.refresh_from_db()
    assert (event.kind, event.status_code) == ("throttled", 429)


def test_nobody_may_add_a_call_or_an_event(root_client, history):
    for model in ("call", "throttleevent"):
        url = reverse(f"admin:ratejobs_{model}_add")
        assert root_client.get(url).status_code == 403
        assert root_client.post(url, {"path": "/x"}).status_code == 403
    assert Call.objects.count() == 1 and ThrottleEvent.objects.count() == 1


@pytest.mark.parametrize("model", [Call, ThrottleEvent])
def test_the_admins_say_no_add_change_or_delete_to_a_superuser(model, superuser, history):
    model_admin = admin.site.get_model_admin(model)
    obj = history["call"] if model is Call else history["event"]
    name = model._meta.model_name
    for url_name, args in (("changelist", []), ("change", [obj.pk]), ("delete", [obj.pk])):
        request = RequestFactory().get(reverse(f"admin:ratejobs_{name}_{url_name}", args=args))
        request.user = superuser
        request.resolver_match = resolve(request.path)
        assert model_admin.has_view_permission(request, obj)
        assert not model_admin.has_add_permission(request)
        assert not model_admin.has_change_permission(request, obj)
        assert not model_admin.has_delete_permission(request, obj)
        assert not model_admin.has_delete_permission(request)
    bare = RequestFactory().get("/")  # no page at all: no
    bare.user = superuser
    assert not model_admin.has_delete_permission(bare, obj)


def test_purging_a_whole_job_still_deletes_its_calls_and_events(root_client, make_job, history):
    job = job_cancel(job=make_job(calls=2, name="to purge"))
    call = job.calls.first()
    ThrottleEvent.objects.create(api=job.api, job=job, call=call, kind="throttled")
    confirmation = root_client.get(reverse("admin:ratejobs_job_delete", args=[job.pk]))
    assert confirmation.status_code == 200
    purged = root_client.post(reverse("admin:ratejobs_job_delete", args=[job.pk]), {"post": "yes"})
    assert purged.status_code == 302
    assert Job.objects.get(pk=job.pk).purge_started is not None
    jobs_purge_requested()  # the background purge, run here
    assert not Call.objects.filter(job_id=job.pk).exists()
    assert not ThrottleEvent.objects.filter(job_id=job.pk).exists()
    # the other job's history is untouched
    assert history["job"].calls.count() == 1 and history["job"].throttle_events.count() == 1


def test_deleting_a_user_takes_their_jobs_calls_and_events_along(
    root_client, make_job, other_user, history
):
    # the records go with what they belong to, asked on the user's own delete page
    job = make_job(calls=2, owner=other_user, name="theirs")
    ThrottleEvent.objects.create(api=job.api, job=job, call=job.calls.first(), kind="throttled")
    url = reverse("admin:auth_user_delete", args=[other_user.pk])
    page = root_client.get(url).content.decode()
    assert "permission to delete" not in page
    assert root_client.post(url, {"post": "yes"}).status_code == 302
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not Call.objects.filter(job_id=job.pk).exists()
    assert history["job"].calls.count() == 1
