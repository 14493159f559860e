"""Cancel, reset limiter and block ask first, in the look of Django's delete confirmation: a GET
(or a POST without post=yes) shows what will happen and changes nothing; the page's form posts
post=yes and acts."""

from __future__ import annotations

import re

from django.urls import reverse

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Call, Job, ThrottleEvent
from ratejobs.services.apis import api_block


def cancel_url(job: Job) -> str:
    return reverse("admin:ratejobs_job_act", args=[job.pk, "cancel"])


def reset_url(api) -> str:
    return reverse("admin:ratejobs_api_reset", args=[api.pk])


def block_url(api) -> str:
    return reverse("admin:ratejobs_api_block", args=[api.pk])


def assert_asks_first(html: str, *, back_to: str, confirm: str) -> None:
    """The admin's confirmation look: "Are you sure?", a summary, Yes and "No, take me back"."""
    assert "<h1>Are you sure?</h1>" in html
    assert "delete-confirmation" in html  # the admin's own styles for the page
    assert '<input type="hidden" name="post" value="yes">' in html
    assert f'<input type="submit" value="{confirm}">' in html
    assert f'<a href="{back_to}" class="button cancel-link">No, take me back</a>' in html


def test_cancel_asks_first_saying_how_many_calls_will_not_be_sent(root_client, make_job):
    # given a job of 5 calls: one succeeded, one on the wire, three not sent yet
    job = make_job(calls=5)
    Call.objects.filter(job=job, index=0).update(status=Call.Status.SUCCEEDED)
    Call.objects.filter(job=job, index=1).update(status=Call.Status.RUNNING)
    Job.objects.filter(pk=job.pk).update(succeeded=1, status=Job.Status.RUNNING)
    page_url = reverse("admin:ratejobs_job_change", args=[job.pk])

    for asked in (root_client.get(cancel_url(job)), root_client.post(cancel_url(job))):
        html = asked.content.decode()
        assert asked.status_code == 200
        assert_asks_first(html, back_to=page_url, confirm="Yes, cancel the job")
        assert "3 of its 5 calls not yet sent" in html
        assert "1 call(s) on the wire now finish" in html
        assert Job.objects.get(pk=job.pk).status == "running"  # nothing changed

    done = root_client.post(cancel_url(job), {"post": "yes"}, follow=True)
    assert done.redirect_chain[-1][0] == page_url
    assert "cancelled; calls not yet started will not be sent" in done.content.decode()
    job.refresh_from_db()
    assert (job.status, job.cancelled) == ("cancelled", 3)


def test_a_job_that_cannot_be_cancelled_is_not_asked_about(root_client, make_job):
    job = make_job(calls=1)
    root_client.post(cancel_url(job), {"post": "yes"})
    answer = root_client.get(cancel_url(job), follow=True)
    assert "Are you sure?" not in answer.content.decode()
    assert "Cannot cancel" in answer.content.decode()


def test_pause_and_resume_need_no_confirmation(root_client, make_job):
    job = make_job(calls=2)
    root_client.post(reverse("admin:ratejobs_job_act", args=[job.pk, "pause"]))
    assert Job.objects.get(pk=job.pk).status == "paused"
    resume_by_get = root_client.get(reverse("admin:ratejobs_job_act", args=[job.pk, "resume"]))
    assert resume_by_get.status_code == 405


def test_reset_asks_first_listing_what_the_limiter_forgets(root_client, api):
    api_block(api=api, seconds=30)
    page_url = reverse("admin:ratejobs_api_change", args=[api.pk])

    html = root_client.get(reset_url(api)).content.decode()
    assert_asks_first(html, back_to=page_url, confirm="Yes, reset the limiter")
    for forgotten in ("pace is forgotten", "block is lifted", "in-flight lease", "grants",
                      "credential key", "Kept: the limits"):  # fmt: skip
        assert forgotten in html, forgotten
    assert 29 < api_limiter(api).state().blocked_for <= 30  # nothing changed yet

    done = root_client.post(reset_url(api), {"post": "yes"}, follow=True)
    assert done.redirect_chain[-1][0] == page_url
    assert "Limiter reset" in done.content.decode()
    assert api_limiter(api).state().blocked_for == 0


def test_block_asks_first_saying_for_how_long_and_until_when(root_client, api):
    asked = root_client.post(block_url(api), {"seconds": "90"})
    html = asked.content.decode()
    assert_asks_first(
        html,
        back_to=reverse("admin:ratejobs_api_change", args=[api.pk]),
        confirm="Yes, block it for 1 min 30 s",
    )
    assert "Every worker stops sending calls" in html
    assert re.search(r"until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d if you confirm now", html)
    assert '<input type="hidden" name="seconds" value="90">' in html
    # a GET with the seconds asks the same, and neither blocked anything
    assert (
        "Yes, block it for 2.5 s"
        in root_client.get(block_url(api), {"seconds": "2.5"}).content.decode()
    )
    assert api_limiter(api).state().blocked_for == 0
    assert not ThrottleEvent.objects.filter(api=api).exists()

    done = root_client.post(block_url(api), {"seconds": "90", "post": "yes"}, follow=True)
    assert "Every worker waits 90 s" in done.content.decode()
    assert 89 < api_limiter(api).state().blocked_for <= 90


def test_a_block_of_no_sensible_length_is_refused_before_asking(root_client, api):
    answer = root_client.get(block_url(api), {"seconds": "abc"}, follow=True)
    assert "Block for how long?" in answer.content.decode()
    assert "Are you sure?" not in answer.content.decode()


def test_who_may_not_act_is_refused_the_confirmation_too(
    admin_client_for, staff, manager, make_job, api, other_user
):
    # given a staff member who may not manage APIs, and a job of another user
    client = admin_client_for(staff)
    assert client.get(reset_url(api)).status_code == 403
    assert client.get(block_url(api), {"seconds": "5"}).status_code == 403
    assert client.post(block_url(api), {"seconds": "5"}).status_code == 403
    theirs = make_job(owner=other_user)
    assert client.get(cancel_url(theirs)).status_code == 404
    # expect: a manager is asked
    assert admin_client_for(manager).get(reset_url(api)).status_code == 200
    assert api_limiter(api).state().blocked_for == 0
    assert Job.objects.get(pk=theirs.pk).status == "queued"


def test_block_says_when_a_longer_block_is_already_in_place(root_client, api):
    api_block(api=api, seconds=60)
    html = root_client.post(block_url(api), {"seconds": "5"}).content.decode()
    assert re.search(r"It is blocked for (59 s|1 min 00 s) more, until [\d: -]+ already", html)
    assert "that longer block is kept" in html
