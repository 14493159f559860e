"""The admin's lists read like a report: every figure with its unit and a sensible precision,
times to the second, a call named by its job and its index there, columns that sort, filters by
outcome."""

from __future__ import annotations

import re
from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ratejobs.models import Call, ThrottleEvent
from ratejobs.services.apis import api_block

CALLS_URL = reverse("admin:ratejobs_call_changelist")
EVENTS_URL = reverse("admin:ratejobs_throttleevent_changelist")
APIS_URL = reverse("admin:ratejobs_api_changelist")
# A float as Python prints it unrounded (13.873418021661024): never on an operator's page.
RAW_FLOAT = re.compile(r"\d+\.\d{4,}")
SECOND_PRECISION = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def result_rows(html: str) -> list[str]:
    """The rows of the change list's results table, as text without tags."""
    body = html.split('id="result_list"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body.split("<tbody>", 1)[1], re.S)
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in rows]


def make_calls_ended(job) -> dict[str, Call]:
    """Calls 0..3 of the job: succeeded at once, succeeded after a 429, failed after a retry,
    and cancelled."""
    finished = timezone.now() - timedelta(seconds=3)
    outcomes = {
        0: {"status": "succeeded", "attempts": 1, "duration": 0.85, "status_code": 200},
        1: {"status": "succeeded", "attempts": 2, "throttled_count": 1, "duration": 4.2,
            "status_code": 200},
        2: {"status": "failed", "attempts": 3, "duration": 0.123456789, "status_code": 503},
        3: {"status": "cancelled"},
    }  # fmt: skip
    for index, fields in outcomes.items():
        Call.objects.filter(job=job, index=index).update(finished=finished, **fields)
    return {call.index: call for call in job.calls.all()}


def test_the_call_list_names_each_call_by_job_and_index_with_units_and_seconds(
    root_client, make_job
):
    job = make_job(calls=5, name="nightly sync")
    make_calls_ended(job)
    html = root_client.get(CALLS_URL, {"job": job.pk, "o": "1"}).content.decode()
    rows = result_rows(html)
    assert rows[0].startswith("nightly sync #0 GET /items/0 Succeeded 200 1 0 850 ms")
    assert "nightly sync #1" in rows[1] and "4.2 s" in rows[1]
    assert "123 ms" in rows[2]
    assert SECOND_PRECISION.search(rows[0])
    assert not RAW_FLOAT.search(html)
    # the whole name and path on hover where a long one is cut
    assert 'class="rj-clip" title="nightly sync"' in html


def test_the_call_list_filters_by_outcome_and_sorts_by_its_columns(root_client, make_job):
    job = make_job(calls=5)
    make_calls_ended(job)

    def indexes(**params) -> list[str]:
        html = root_client.get(CALLS_URL, {"job": job.pk, **params}).content.decode()
        return [re.search(r"#(\d+)", row).group(1) for row in result_rows(html)]

    assert indexes(outcome="succeeded") == ["0", "1"]
    assert indexes(outcome="failed") == ["2"]
    assert indexes(outcome="cancelled") == ["3"]
    assert indexes(outcome="unfinished") == ["4"]
    assert indexes(outcome="throttled") == ["1"]
    assert indexes(outcome="retried") == ["1", "2"]
    # columns (no checkbox: the list has no action): call, request, status, HTTP, tries, 429s,
    # took, finished
    assert indexes(outcome="retried", o="-6") == ["1", "2"]  # the longest first
    assert indexes(outcome="retried", o="6") == ["2", "1"]
    assert indexes(o="-4")[:2] == ["2", "1"]  # the most tries first
    assert indexes(o="-5")[0] == "1"  # the most 429s first
    for column in range(1, 9):
        assert root_client.get(CALLS_URL, {"o": str(column)}).status_code == 200


def test_a_call_s_page_names_it_and_shows_its_duration_with_a_unit(root_client, make_job):
    job = make_job(calls=1, name="nightly sync")
    call = make_calls_ended(job)[0]
    html = root_client.get(reverse("admin:ratejobs_call_change", args=[call.pk])).content.decode()
    assert str(call) == "nightly sync #0 (GET /items/0)"
    assert "nightly sync #0 (GET /items/0)" in html  # the title and breadcrumbs
    assert "850 ms" in html and SECOND_PRECISION.search(html)
    assert not RAW_FLOAT.search(html)


def test_throttle_events_show_the_call_index_rounded_rates_and_units(root_client, make_job):
    job = make_job(calls=20, name="nightly sync")
    call = job.calls.get(index=17)
    ThrottleEvent.objects.create(
        api=job.api, job=job, call=call, kind="throttled", status_code=429, retry_after=2.5
    )
    cut = ThrottleEvent.objects.create(
        api=job.api, job=job, call=call, kind="rate_decreased",
        rate_before=13.873418021661024, rate_after=9.711392615162717,
    )  # fmt: skip
    html = root_client.get(EVENTS_URL, {"o": "-1"}).content.decode()
    call_url = reverse("admin:ratejobs_call_change", args=[call.pk])
    assert f'<a href="{call_url}">#17</a>' in html
    assert "13.9/s → 9.7/s" in html and "2.5 s" in html
    assert not RAW_FLOAT.search(html)
    assert all(SECOND_PRECISION.search(row) for row in result_rows(html))
    rows = result_rows(root_client.get(EVENTS_URL, {"kind__exact": "throttled"}).content.decode())
    assert len(rows) == 1 and "429 received" in rows[0]
    for column in range(1, 9):
        assert root_client.get(EVENTS_URL, {"o": str(column)}).status_code == 200
    # and the event's own page
    url = reverse("admin:ratejobs_throttleevent_change", args=[cut.pk])
    page = root_client.get(url).content.decode()
    assert "13.9/s → 9.7/s" in page and "nightly sync #17" in page
    assert not RAW_FLOAT.search(page) and SECOND_PRECISION.search(page)


def test_the_api_list_shows_limits_live_state_and_long_urls_with_units(root_client, make_api):
    long_url = "https://api.example.com/v1/" + "very-long-segment/" * 8
    api = make_api(base_url=long_url, rate=300, period=60, burst=10)
    api_block(api=api, seconds=30)
    html = root_client.get(APIS_URL).content.decode()
    (row,) = [row for row in result_rows(html) if api.name in row]
    assert "300 per 60 s (5.0/s) (burst 10)" in row
    assert re.search(r"\b\d+(\.\d)?/s\b", row.split("(burst 10)", 1)[1])  # the rate now
    assert re.search(r"\b(29\.\d|30) s\b", row)  # blocked for
    assert "not counted (no cap)" in row
    assert f'class="rj-clip" title="{long_url}"' in html
    assert not RAW_FLOAT.search(html)


def test_the_call_and_event_lists_cost_the_same_queries_however_many_rows(root_client, make_job):
    def queries(url: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert root_client.get(url).status_code == 200
        return len(captured)

    def add_rows(count: int) -> None:
        job = make_job(calls=count)
        make_calls_ended(job)
        for call in job.calls.all():
            ThrottleEvent.objects.create(api=job.api, job=job, call=call, kind="throttled")

    add_rows(4)
    few = (queries(CALLS_URL), queries(EVENTS_URL))
    add_rows(12)
    assert (queries(CALLS_URL), queries(EVENTS_URL)) == few
