"""An operator's day in a real browser: log in, submit a job from the admin against the sandbox
API, pause and resume it, watch its page fill up to 100% on its own, look at the job list; edit
an API's limit and block it from its page.

Real parts only: the live Django server, Celery worker processes, the broker and limiter in
Redis, the sandbox API as the third party, and Chromium.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Api, Job
from ratejobs.selectors.apis import api_limiter_state
from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

CALLS = 100
PASSWORD = "browser-test-password"


def log_in(page: Any, base_url: str, username: str = "operator") -> None:
    """Log in as `username`, a superuser made here unless the test made that user itself."""
    if not get_user_model().objects.filter(username=username).exists():
        get_user_model().objects.create_superuser(username, password=PASSWORD)
    page.set_default_timeout(30_000)
    page.goto(f"{base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}/admin/")


def test_submit_a_job_pause_resume_and_watch_it_complete(
    live_server, services_redis, sandbox, start_worker, unique_name, browser_page, screenshot
):
    # given a sandbox API, a limit of 20/s on it, two worker processes and an operator
    server = sandbox(rate=30, burst=5)
    api_create(name=unique_name, base_url=server.url, rate=20, burst=2)
    start_worker(concurrency=2)
    page = browser_page
    log_in(page, live_server.url)

    # when the operator submits a job from a path template
    page.goto(f"{live_server.url}/admin/ratejobs/job/add/")
    page.select_option("#id_api", label=unique_name)
    page.fill("#id_name", "seen in a browser")
    page.fill("#id_path_template", "/items/{id}")
    page.fill("#id_values", "\n".join(str(i) for i in range(CALLS)))
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/ratejobs/job/*/change/")
    job = Job.objects.get(name="seen in a browser")

    # and pauses it, then resumes it, with the page's buttons
    page.click("button[data-action=pause]")
    page.locator(".messagelist", has_text="paused").wait_for()
    assert Job.objects.get(pk=job.pk).status == "paused"
    assert page.locator("button[data-action=resume]").is_visible()
    assert not page.locator("button[data-action=pause]").is_visible()
    page.click("button[data-action=resume]")
    page.locator(".messagelist", has_text="resumed").wait_for()

    # then the page updates itself (no reload) until its progress bar reads 100%
    page.evaluate("window.notReloaded = true")
    page.locator('#rj-progress-bar .rj-progress[aria-valuenow="100"]').wait_for(timeout=180_000)
    page.locator('#rj-job[data-final="true"]').wait_for()
    assert page.evaluate("window.notReloaded") is True
    assert page.locator('[data-field="succeeded"]').inner_text() == str(CALLS)
    assert page.locator('[data-field="status_display"]').inner_text() == "Completed"
    assert page.locator("#rj-chart svg").count() == 1
    # the links to its calls count them as they ended, not as they stood at page load
    links = page.locator("[data-calls-links]").inner_text()
    assert f"200 ({CALLS})" in links and "so far" not in links
    # a completed job without failures offers none of pause, resume, cancel or retry; only
    # running it again
    assert page.locator(".rj-actions button[data-action]:visible").count() == 0
    assert page.get_by_role("button", name="Run again").is_visible()
    print("job page:", screenshot(page, "job-page"))

    # and downloads its results with the page's button: a row a call, after the header
    with page.expect_download() as download:
        page.click("text=Download results (CSV)")
    assert download.value.suggested_filename == f"job-{job.pk}-results.csv"
    lines = Path(download.value.path()).read_text().splitlines()
    assert len(lines) == CALLS + 1 and lines[0].startswith("index,method,path,status,")

    job.refresh_from_db()
    assert (job.status, job.succeeded, job.failed) == ("completed", CALLS, 0)
    assert server.stats()["arrivals"] == CALLS

    # and the job list shows it complete
    page.goto(f"{live_server.url}/admin/ratejobs/job/")
    row = page.locator("#result_list tbody tr", has_text="seen in a browser")
    assert row.locator('.rj-progress[aria-valuenow="100"]').count() == 1
    print("job list:", screenshot(page, "job-list"))


def test_edit_an_api_limit_and_block_it_from_its_page(
    live_server, services_redis, unique_name, browser_page, screenshot
):
    api = api_create(name=unique_name, base_url="https://api.example.com/v1", rate=10)
    page = browser_page
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/admin/ratejobs/api/{api.pk}/change/")

    # Enter in a field of the API's form saves the API (and touches nothing else)
    page.fill("#id_rate", "25")
    page.press("#id_rate", "Enter")
    page.locator(".messagelist", has_text="was changed successfully").wait_for()
    assert Api.objects.get(pk=api.pk).rate == 25
    assert api_limiter_state(api).rate == 25

    # the block control blocks every worker, and the page shows it
    page.goto(f"{live_server.url}/admin/ratejobs/api/{api.pk}/change/")
    page.fill("input[name=seconds]", "30")
    page.press("input[name=seconds]", "Enter")
    page.locator("h1", has_text="Are you sure?").wait_for()  # asked first, as a delete is
    page.click("input[type=submit][value^='Yes']")
    page.locator(".messagelist", has_text="Every worker waits 30 s").wait_for()
    assert page.locator("#rj-limiter .rj-blocked").count() == 1
    assert api_limiter_state(api).blocked_for > 20
    print("API page:", screenshot(page, "api-page"))

    page.click("#rj-reset-button")
    page.click("input[type=submit][value^='Yes']")
    page.locator(".messagelist", has_text="Limiter reset").wait_for()
    assert api_limiter_state(api).blocked_for == 0


def test_a_staff_member_who_does_not_manage_apis_sees_an_api_read_only(
    live_server, services_redis, unique_name, browser_page, screenshot
):
    # given an API with a stored credential and a header holding a key, and a staff member
    # without the ratejobs.manage_api permission
    api = api_create(
        name=unique_name, base_url="https://api.example.com/v1", rate=10,
        default_headers={"X-Static-Key": "static-secret-value"}, credential="stored-secret",
    )  # fmt: skip
    get_user_model().objects.create_user("viewer", password=PASSWORD, is_staff=True)
    page = browser_page
    log_in(page, live_server.url, "viewer")

    page.goto(f"{live_server.url}/admin/ratejobs/api/{api.pk}/change/")
    page.locator("#rj-limiter").wait_for()
    text = page.content()
    # expect: the limits and live state, no way to change, block or reset, and no secret
    assert page.locator("input[name=_save]").count() == 0
    assert page.locator("text=Reset limiter").count() == 0
    assert page.locator("input[name=seconds]").count() == 0
    assert "X-Static-Key: ***" in text
    assert "static-secret-value" not in text and "stored-secret" not in text
    print("API page, read only:", screenshot(page, "api-page-read-only"))


def test_an_api_with_several_limits_shows_each_window_and_its_job_offers_its_results(
    live_server, services_redis, unique_name, browser_page, screenshot
):
    # given an API with a per-minute window and a daily token quota, some of each spent, and a
    # job on it whose calls carry their estimated tokens
    api = api_create(
        name=unique_name, base_url="https://api.example.com/v1", rate=20, burst=5,
        limits=[{"rate": 10, "period": 60, "burst": 10},
                {"rate": 9000, "period": 86400, "burst": 9000, "unit": "cost"}],
        cost_json_field="usage.total_tokens",
    )  # fmt: skip
    limiter = api_limiter(api)
    for _ in range(3):
        limiter.release(limiter.acquire(cost=1000, max_wait=5))
    owner = get_user_model().objects.create_superuser("operator", password=PASSWORD)
    job = job_create(owner=owner, api=api, name="with costs",
                     calls=[{"path": f"/items/{i}", "cost": 100} for i in range(3)])  # fmt: skip
    page = browser_page
    log_in(page, live_server.url)

    # expect: the API page shows the main rate and a line per window, what is left of each and
    # when it is whole again, and the form the limits and cost fields
    page.goto(f"{live_server.url}/admin/ratejobs/api/{api.pk}/change/")
    state = page.locator("#rj-limiter table.rj-state")
    state.wait_for()
    ceiling = state.locator("tr:has(th:text-is('ceiling'))").inner_text()
    assert ceiling.endswith("20/s (burst 5)")
    lines = state.locator("tr:has(th:text-is('limit'))").all_inner_texts()
    assert len(lines) == 2, lines
    assert "10 per 60 s (burst 10): 7 left, full in 1" in lines[0]
    assert "9000 cost per 86400 s (burst 9000): 6000 left, full in " in lines[1]

    # the windows as rows in their units (86400 s as 1 day), then two empty rows
    def row(index: int) -> tuple[str, ...]:
        return tuple(page.locator(f"[name=limits-{index}-{name}]").input_value()
                     for name in ("rate", "period", "period_unit", "burst", "unit"))  # fmt: skip

    assert row(0) == ("10", "1", "minutes", "10", "requests")
    assert row(1) == ("9000", "1", "days", "9000", "cost")
    assert row(2) == row(3) == ("", "", "seconds", "", "requests")
    assert page.locator("[name=limits-4-rate]").count() == 0
    assert page.locator("#id_cost_json_field").input_value() == "usage.total_tokens"
    print("API page with limits:", screenshot(page, "api-page-limits"))
    page.set_viewport_size({"width": 1280, "height": 1000})
    print("API page with limits, 1280 px:", screenshot(page, "api-page-limits-1280"))

    # when the operator fills an empty row with an hourly quota and saves
    page.fill("[name=limits-2-rate]", "500")
    page.fill("[name=limits-2-period]", "1")
    page.select_option("[name=limits-2-period_unit]", "hours")
    page.fill("[name=limits-2-burst]", "50")
    page.click("input[name=_continue]")
    page.locator(".messagelist", has_text="was changed successfully").wait_for()
    # then the API holds it after the others, its period in seconds, and the page shows it
    api.refresh_from_db()
    assert api.limits[2] == {"rate": 500, "period": 3600, "burst": 50, "unit": "requests"}
    assert api.limits[:2] == [
        {"rate": 10, "period": 60, "burst": 10, "unit": "requests"},
        {"rate": 9000, "period": 86400, "burst": 9000, "unit": "cost"},
    ]
    assert api.limits_version == 2
    assert row(2) == ("500", "1", "hours", "50", "requests")
    assert page.locator("[name=limits-4-rate]").count() == 1  # two empty rows again

    # and its job's page offers the results as files
    page.goto(f"{live_server.url}/admin/ratejobs/job/{job.pk}/change/")
    for label in ("CSV", "JSONL"):
        assert page.locator(f"a.rj-download:has-text('Download results ({label})')").count() == 1
    print("job page with the download buttons:", screenshot(page, "job-page-downloads"))
