"""The API page with several limits: each window's line (what is left, when it is full again),
and the limits and cost fields edited in the form with errors by row."""

from __future__ import annotations

import re

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Call, Job
from tests.admin.test_api_page import change_url, form_data
from tests.admin.test_submit import submit

LIMITS = [
    {"rate": 300, "period": 60, "burst": 10},
    {"rate": 90000, "period": 60, "burst": 9000, "unit": "cost"},
]


def test_the_api_page_shows_each_window_with_what_is_left_and_when_it_is_full(
    root_client, make_api
):
    # windows that refill slowly enough (one request in 6 s, 0.1 token a second) for the
    # counts to be exact
    daily_tokens = {"rate": 9000, "period": 86400, "burst": 9000, "unit": "cost"}
    api = make_api(limits=[{"rate": 10, "period": 60, "burst": 10}, daily_tokens], rate=20, burst=5)
    limiter = api_limiter(api)
    # given three calls granted, costing 1,000 tokens each
    for _ in range(3):
        limiter.release(limiter.acquire(cost=1000, max_wait=5))
    html = root_client.get(change_url(api)).content.decode()
    # expect: a line per window besides the main rate's ceiling
    assert "20/s (burst 5)" in html
    assert "10 per 60 s (burst 10): 7 left, full in 1" in html  # 17 or 18 s
    # 3,000 tokens taken at 9,000 a day come back in 8 hours (less the time the test took)
    assert re.search(
        r"9000 cost per 86400 s \(burst 9000\): 6000 left, full in (8 h 00|7 h 59) min", html
    )
    listing = root_client.get(reverse("admin:ratejobs_api_changelist")).content.decode()
    assert "20/s (burst 5) + 2 more" in listing


def test_limits_and_cost_fields_are_edited_in_the_form_with_errors_by_row(
    root_client, api, django_capture_on_commit_callbacks
):
    bad = [{"rate": 300, "period": 60, "burst": 10}, {"rate": 10, "period": -5, "burst": 1}]
    response = root_client.post(change_url(api), form_data(api, limits=bad))
    assert response.status_code == 200
    assert "row 2: period must be a positive number" in response.content.decode()
    api.refresh_from_db()
    assert api.limits == []

    changes = {"limits": LIMITS, "cost_header": "X-Tokens-Used",
               "cost_json_field": "usage.total_tokens"}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        response = root_client.post(change_url(api), form_data(api, **changes))
    assert response.status_code == 302, response.content.decode()[:3000]
    api.refresh_from_db()
    assert [w["unit"] for w in api.limits] == ["requests", "cost"]
    assert (api.cost_header, api.cost_json_field) == ("X-Tokens-Used", "usage.total_tokens")
    labels = [w.window.label for w in api_limiter(api).state().windows]
    assert labels == ["300/60s", "90000 cost/60s"]

    # emptied rows remove them
    with django_capture_on_commit_callbacks(execute=True):
        response = root_client.post(change_url(api), form_data(api, limits=[], cost_header="X"))
    assert response.status_code == 302
    api.refresh_from_db()
    assert api.limits == [] and api_limiter(api).state().windows == ()


def test_a_bad_cost_header_is_a_form_error(root_client, api):
    response = root_client.post(change_url(api), form_data(api, cost_header="X Tokens"))
    assert response.status_code == 200 and "cost_header" in response.content.decode()
    api.refresh_from_db()
    assert api.cost_header == ""


def test_the_submit_page_takes_each_call_s_cost_from_a_file_or_one_for_a_template(
    root_client, make_api
):
    api = make_api(limits=[{"rate": 9000, "period": 60, "burst": 900, "unit": "cost"}])
    upload = SimpleUploadedFile("calls.csv", b"path,cost\n/a,40\n/b,\n")
    assert submit(root_client, api, calls_file=upload).status_code == 302
    response = submit(root_client, api, path_template="/u/{id}", values="1\n2\n", cost=900)
    assert response.status_code == 302
    costs = Call.objects.filter(job__api=api).order_by("job_id", "index")
    assert list(costs.values_list("cost", flat=True)) == [40, 0, 900, 900]
    # more than the cost window's burst is refused by line, and nothing is stored
    upload = SimpleUploadedFile("calls.csv", b"path,cost\n/a,40\n/b,901\n")
    response = submit(root_client, api, calls_file=upload)
    assert response.status_code == 200
    assert "line 3: cost: must be a whole number from 0 to 900" in response.content.decode()
    assert Job.objects.filter(api=api).count() == 2
