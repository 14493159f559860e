"""A call's detail lists each of its attempts; a page of calls stays light (the counts only)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from ratejobs.models import Call, CallAttempt


def _throttled_then_answered(call: Call) -> None:
    first = timezone.now() - timedelta(seconds=3)
    CallAttempt.objects.create(
        job_id=call.job_id, call=call, number=1, outcome="throttled", started=first,
        finished=first + timedelta(milliseconds=40), duration=0.04, status_code=429,
        throttled=True, retry_after="2", retry_in=2.0,
        throttle_headers={"retry-after": "2", "x-ratelimit-remaining": "0"},
    )  # fmt: skip
    last = first + timedelta(seconds=2.1)
    CallAttempt.objects.create(
        job_id=call.job_id, call=call, number=2, outcome="succeeded", started=last,
        finished=last + timedelta(milliseconds=30), duration=0.03, status_code=200,
    )  # fmt: skip
    Call.objects.filter(pk=call.pk).update(
        status=Call.Status.SUCCEEDED, status_code=200, attempts=1, throttled_count=1
    )


def test_the_call_detail_lists_its_attempts_oldest_first(api_client: Any, make_job: Any):
    job = make_job(calls=2)
    _throttled_then_answered(job.calls.get(index=1))

    detail = api_client.get(f"/api/jobs/{job.pk}/calls/1/").json()

    assert (detail["attempts"], detail["throttled_count"]) == (1, 1)  # the counts, as before
    history = detail["attempt_history"]
    assert [(a["number"], a["status_code"], a["outcome"]) for a in history] == [
        (1, 429, "throttled"),
        (2, 200, "succeeded"),
    ]
    first = history[0]
    assert (first["throttled"], first["retry_after"], first["retry_in"]) == (True, "2", 2.0)
    assert first["throttle_headers"] == {"retry-after": "2", "x-ratelimit-remaining": "0"}
    assert first["duration"] == 0.04 and first["error"] == ""
    assert history[1]["retry_in"] is None
    # a call not sent yet has none
    assert api_client.get(f"/api/jobs/{job.pk}/calls/0/").json()["attempt_history"] == []


def test_a_page_of_calls_carries_no_attempts(
    api_client: Any, make_job: Any, django_assert_max_num_queries: Any
):
    job = make_job(calls=3)
    for call in job.calls.all():
        _throttled_then_answered(call)
    with django_assert_max_num_queries(6):  # no query per call for its attempts
        results = api_client.get(f"/api/jobs/{job.pk}/calls/").json()["results"]
    assert len(results) == 3
    assert all("attempt_history" not in call for call in results)
    assert all(call["attempts"] == 1 for call in results)


def test_another_users_call_and_its_attempts_stay_hidden(
    make_job: Any, client_for: Any, other_user: Any
):
    job = make_job(calls=1)
    _throttled_then_answered(job.calls.get())
    assert client_for(other_user).get(f"/api/jobs/{job.pk}/calls/0/").status_code == 404
