"""The console as its own site (issue 26): named ratejobs, the overview as its home, the sidebar
in the order operators use it, titles that name records rather than offer to change them, the
job page without empty callback rows, and a job list that fits 1280 px."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.urls import reverse
from django.utils import timezone

from ratejobs.console import ConsoleSite
from ratejobs.models import Job, ThrottleEvent
from tests.browser.conftest import browser_page, chromium_path, screenshot  # noqa: F401
from tests.browser.test_admin_in_browser import log_in

JOBS_URL = reverse("admin:ratejobs_job_changelist")
OVERVIEW_URL = reverse("ratejobs_overview")


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def page_title(html: str) -> str:
    return text(re.search(r"<title>(.*?)</title>", html, re.S).group(1))


def heading(html: str) -> str:
    return text(re.search(r'<div id="content"[^>]*>\s*<h1>(.*?)</h1>', html, re.S).group(1))


def sidebar_links(html: str) -> list[str]:
    sidebar = html.split('id="nav-sidebar"', 1)[1].split("</nav>", 1)[0]
    return [text(name) for name in re.findall(r'<th scope="row"[^>]*>(.*?)</th>', sidebar, re.S)]


def job_page(client: Any, job: Job) -> str:
    response = client.get(reverse("admin:ratejobs_job_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


# --- 1. the site: its name, its home, its sidebar, its header's links ----------------------


def test_the_project_s_admin_is_the_console_named_ratejobs(root_client):
    assert isinstance(admin.site._wrapped, ConsoleSite)
    html = root_client.get(JOBS_URL).content.decode()
    assert "Django administration" not in html and "Django site admin" not in html
    assert re.search(r'<div id="site-name"><a href="/admin/">\s*ratejobs\s*</a>', html)
    assert page_title(html) == "Jobs | ratejobs"


def test_a_host_that_keeps_django_s_admin_keeps_its_own_name():
    # installing ratejobs changes no other site: only listing ConsoleAdminConfig does
    assert AdminSite().site_header == "Django administration"


def test_the_admin_s_home_is_the_overview(root_client, staff, admin_client_for, client):
    assert reverse("admin:index") == "/admin/"
    for person in (root_client, admin_client_for(staff)):
        response = person.get(reverse("admin:index"))
        assert response.status_code == 200
        html = response.content.decode()
        assert 'id="rj-overview"' in html and "ratejobs/overview.js" in html
        assert page_title(html).endswith("Overview | ratejobs")
    # still behind the sign-in
    assert client.get(reverse("admin:index")).status_code == 302


def test_the_sidebar_lists_what_operators_use_first(root_client):
    html = root_client.get(JOBS_URL).content.decode()
    assert sidebar_links(html) == [
        "Overview", "Jobs", "APIs", "Calls", "Throttle events", "Signing keys",
        "Users", "Groups", "Tokens",
    ]  # fmt: skip
    sidebar = html.split('id="nav-sidebar"', 1)[1].split("</nav>", 1)[0]
    assert f'<a href="{OVERVIEW_URL}">Overview</a>' in sidebar
    # the overview's own page lists it too, marked as where one is
    overview = root_client.get(OVERVIEW_URL).content.decode()
    assert sidebar_links(overview)[0] == "Overview"
    assert re.search(r'<tr class="model-overview current-model">', overview)


def test_staff_see_ratejobs_pages_only_in_the_sidebar(admin_client_for, staff):
    html = admin_client_for(staff).get(JOBS_URL).content.decode()
    assert sidebar_links(html)[:2] == ["Overview", "Jobs"]
    assert "Users" not in sidebar_links(html)


def test_the_header_links_to_the_overview_and_flower(root_client, settings):
    settings.RATEJOBS_FLOWER_URL = "https://flower.example.com/"
    html = root_client.get(JOBS_URL).content.decode()
    user_tools = html.split('id="user-tools"', 1)[1].split("</div>", 1)[0]
    assert f'<a href="{OVERVIEW_URL}">Overview</a>' in user_tools
    assert 'href="https://flower.example.com/"' in user_tools
    settings.RATEJOBS_FLOWER_URL = ""
    html = root_client.get(JOBS_URL).content.decode()
    assert "Flower" not in html.split('id="user-tools"', 1)[1].split("</div>", 1)[0]


# --- 2. titles: records are looked at, not changed ------------------------------------------


def test_jobs_calls_and_events_are_titled_by_what_they_are(root_client, make_job):
    job = make_job(calls=2, name="nightly sync")
    call = job.calls.get(index=1)
    event = ThrottleEvent.objects.create(api=job.api, job=job, call=call, kind="throttled")
    pages = {
        JOBS_URL: "Jobs",
        reverse("admin:ratejobs_job_change", args=[job.pk]): f"nightly sync (#{job.pk})",
        reverse("admin:ratejobs_call_changelist"): "Calls",
        reverse("admin:ratejobs_call_change", args=[call.pk]): str(call),
        reverse("admin:ratejobs_throttleevent_changelist"): "Throttle events",
        reverse("admin:ratejobs_throttleevent_change", args=[event.pk]): str(event),
    }
    for url, title in pages.items():
        html = root_client.get(url).content.decode()
        assert heading(html) == title, url
        assert page_title(html) == f"{title} | ratejobs", url
        for stock in ("Change job", "Select job", "View call", "Select call", "to change"):
            assert stock not in text(html), (url, stock)


def test_an_api_keeps_the_title_of_a_page_managers_edit(root_client, make_api):
    api = make_api()
    html = root_client.get(reverse("admin:ratejobs_api_change", args=[api.pk])).content.decode()
    assert heading(html).startswith("Change")


# --- 3. the job page: callback rows only with a callback, labels as operators write them -----


def test_a_job_without_a_callback_shows_no_callback_rows(root_client, make_job):
    html = job_page(root_client, make_job(calls=1))
    assert "field-callback" not in html and "Callback" not in text(html)
    assert "<label>API:</label>" in html and "Api:" not in html


def test_a_job_with_a_callback_shows_its_delivery(root_client, make_job):
    job = make_job(calls=1)
    # set directly: submitting with a callback also wants a signing key, beside the point here
    Job.objects.filter(pk=job.pk).update(callback_url="https://hooks.example.com/done")
    html = job_page(root_client, job)
    assert "<label>Callback URL:</label>" in html and "Callback url" not in html
    assert "https://hooks.example.com/done" in html
    for field in ("callback_status", "callback_attempts", "callback_delivered_clock"):
        assert f"field-{field}" in html, field
    api_url = reverse("admin:ratejobs_api_change", args=[job.api_id])
    row = html.split("field-api_link", 1)[1].split("</div>", 2)
    assert f'<a href="{api_url}">{job.api.name}</a>' in "".join(row)


# --- 4. the job list: its size, and 1280 px --------------------------------------------------


def test_the_job_list_shows_each_job_s_size(root_client, make_job):
    make_job(calls=7, name="seven")
    html = root_client.get(JOBS_URL).content.decode()
    assert re.search(r'<th scope="col" class="sortable column-calls_column', html)
    row = html.split('class="field-name"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="field-calls_column">7</td>' in row


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_job_list_fits_1280_px(live_server, make_job, browser_page, screenshot):  # noqa: F811
    # the longest a row gets: long names, wide figures, finished jobs' "(average)" pace
    now = timezone.now()
    for n in range(12):
        job = make_job(calls=3, name=f"demo: 500 calls against the sandbox, run {n}")
        finished = {"status": "completed", "finished": now} if n % 2 else {"status": "running"}
        Job.objects.filter(pk=job.pk).update(
            **finished, total=123456, started=now - timedelta(hours=2),
            succeeded=100000 if n % 2 else 60000, failed=23456, throttled=12345,
        )  # fmt: skip
    page = browser_page
    log_in(page, live_server.url)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server.url}{JOBS_URL}")
    print("job list:", screenshot(page, "job-list-1280"))
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    results = "document.querySelector('#changelist .results')"
    assert page.evaluate(f"{results}.scrollWidth <= {results}.clientWidth")
    assert page.is_visible("#nav-sidebar")
    # no cell cut: each date whole, each name whole or wrapped
    clipped = page.evaluate(
        """[...document.querySelectorAll('#result_list td, #result_list th')]
            .filter(cell => cell.scrollWidth > cell.clientWidth + 1)
            .map(cell => cell.className + ': ' + cell.textContent.trim())"""
    )
    assert clipped == []
    created = page.locator("#result_list td.field-created_clock").first.inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", created.strip().replace("\n", " "))
