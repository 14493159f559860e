"""A call's admin page shows its attempts in a table, read-only like the rest of the call."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone

from ratejobs.admin import calls as call_admin
from ratejobs.models import Call, CallAttempt


def _attempts(call: Call, count: int) -> None:
    start = timezone.now() - timedelta(seconds=count)
    for number in range(1, count + 1):
        last = number == count
        at = start + timedelta(seconds=number)
        CallAttempt.objects.create(
            job_id=call.job_id, call=call, number=number,
            outcome="succeeded" if last else "retry", started=at,
            finished=at + timedelta(milliseconds=25), duration=0.025,
            status_code=200 if last else 503, retry_after="" if last else "7",
            retry_in=None if last else 7.0, error="" if last else "server error 503",
            throttle_headers={} if last else {"retry-after": "7", "x-ratelimit-limit": "60"},
        )  # fmt: skip


def _table(html: str) -> str:
    match = re.search(r'<table class="rj-attempts">.*?</table>', html, re.S)
    assert match, "no Attempts table on the page"
    return match.group(0)


def test_the_call_page_shows_each_attempt(root_client: Any, make_job: Any):
    job = make_job(calls=1)
    call = job.calls.get()
    _attempts(call, 3)
    page = root_client.get(reverse("admin:ratejobs_call_change", args=[call.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    table = _table(html)
    rows = re.findall(r"<tr>\s*<td>(\d+)</td>", table)
    assert rows == ["1", "2", "3"]
    assert table.count("<td>503</td>") == 2 and "<td>200</td>" in table
    assert "retry-after: 7" in table and "x-ratelimit-limit: 60" in table
    assert "server error 503" in table and "7.0 s" in table and "25 ms" in table
    # read-only: nothing to edit or save on the page
    assert 'name="_save"' not in html
    assert 'name="number"' not in html


def test_a_call_without_attempt_rows_says_why(root_client: Any, make_job: Any):
    call = make_job(calls=1).calls.get()
    page = reverse("admin:ratejobs_call_change", args=[call.pk])
    assert b"Not sent." in root_client.get(page).content
    # answered at its first try: the call's own result is that try, with no row of its own
    type(call).objects.filter(pk=call.pk).update(status="succeeded", attempts=1, status_code=200)
    assert b"Sent once: the result above is its only attempt." in root_client.get(page).content


def test_a_long_history_shows_its_newest_attempts(
    root_client: Any, make_job: Any, monkeypatch: Any
):
    monkeypatch.setattr(call_admin, "ATTEMPTS_SHOWN", 2)
    call = make_job(calls=1).calls.get()
    _attempts(call, 5)
    html = root_client.get(reverse("admin:ratejobs_call_change", args=[call.pk])).content.decode()
    assert re.findall(r"<tr>\s*<td>(\d+)</td>", _table(html)) == ["4", "5"]
    assert "3 earlier attempts not shown" in html


def test_staff_do_not_see_attempts_of_others_calls(
    admin_client_for: Any, staff: Any, make_job: Any
):
    call = make_job(calls=1).calls.get()
    _attempts(call, 2)
    page = admin_client_for(staff).get(reverse("admin:ratejobs_call_change", args=[call.pk]))
    assert page.status_code in (302, 403, 404)


def test_a_call_page_counts_every_request_sent_429s_included(root_client: Any, make_job: Any):
    # given a call sent six times: five 429s (which use no attempt) and a 200
    call = make_job(calls=1).calls.get()
    type(call).objects.filter(pk=call.pk).update(
        status="succeeded", attempts=1, throttled_count=5, status_code=200
    )
    html = root_client.get(reverse("admin:ratejobs_call_change", args=[call.pk])).content
    # expect: six requests, not "attempts: 1"
    text = re.sub(r"<[^>]+>|\s+", " ", html.decode())
    max_attempts = call.job.api.max_attempts
    assert f"6 (1 of {max_attempts} attempts used; 5 answered 429, which use none)" in text
