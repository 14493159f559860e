"""A new operator's path through the console, at 1280 and 1920 px: the site's root, the
overview, a job running against an API that answers some calls 429, its calls, one call's
attempts, the API's page and "Run again". On every page nothing scrolls sideways, and the job's
figures agree with each other, with the overview and with the database; calls and throttle
events cannot be deleted one at a time, by a superuser neither.

Real parts only: the live Django server, a Celery worker, the broker and limiter in Redis, the
sandbox API and Chromium.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from ratejobs.models import Call, CallAttempt, Job, ThrottleEvent
from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create
from tests.browser.test_admin_in_browser import PASSWORD, log_in
from tests.browser.test_operator_view import DURATION, RATE, field_problems, figure_problems

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
expect = pytest.importorskip("playwright.sync_api").expect

WIDTHS = (1280, 1920)
HEIGHTS = {1280: 900, 1920: 1080}
# The sandbox takes 4 requests a second with GitHub's headers; the API is configured far
# faster, so calls sent together meet 429s with a Retry-After and are sent again after it.
# 16 calls at 4/s outlast the walk to the job's page, so the operator sees it running.
SANDBOX_RATE, CALLS = 4, 16
FINAL_WITHIN_MS = 60_000

COUNT = re.compile(r"^\d[\d,]*$")
DONE = re.compile(
    r"^(?P<ran>\d[\d,]*) of (?P<total>\d[\d,]*)(?: \((?P<cancelled>\d[\d,]*) cancelled\))?$"
)
CODE_LINK = re.compile(r"^(?P<code>\d{3}) \((?P<count>\d[\d,]*)\)$")
CLOCK_FRACTION = re.compile(r"figure without a unit '(\d+\.\d+)' in ….*\d\d:\d\d:\1")
MOMENT = re.compile(r"\d\d:\d\d:\d\d")
# A count reads bare ("16"); any other figure of the progress box must say what it counts in.
UNIT = re.compile(r"\d ?(?:ms|s|min|h|/s|%)(?![A-Za-z])")
COUNT_FIELDS = ("succeeded", "failed", "cancelled", "throttled", "retries")
RATE_FIELDS = ("average_rate", "pace_text")
DURATION_FIELDS = ("duration", "eta")


def number(text: str) -> int:
    """The count a cell leads with: "1,200", "16 calls", "3 × 429"."""
    match = re.match(r"\s*(\d[\d,]*)", text)
    assert match, f"no count in {text!r}"
    return int(match[1].replace(",", ""))


def layout_problems(page: Any, where: str) -> list[str]:
    """What makes a page awkward at its width: a sideways scroll, a sidebar that is shut."""
    problems = []
    scroll, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    if scroll > inner:
        problems.append(f"{where}: scrolls sideways, {scroll} px wide in a {inner} px window")
    sidebar = page.locator("#nav-sidebar")
    if sidebar.count() and not sidebar.is_visible():
        problems.append(f"{where}: the sidebar is shut")
    return problems


def look(page: Any, screenshot: Any, name: str) -> list[str]:
    """The page at each width, its screenshot and what is wrong with its layout; back to the
    narrow width after."""
    problems = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": HEIGHTS[width]})
        problems += layout_problems(page, f"{name} at {width} px")
        print(f"{name}:", screenshot(page, f"operator-path-{name}-{width}"))
    page.set_viewport_size({"width": WIDTHS[0], "height": HEIGHTS[WIDTHS[0]]})
    # An attempt's start is a time of day to the millisecond, on purpose (attempts of a call
    # can be that close); its fraction of a second is no figure without a unit.
    return problems + [
        problem for problem in figure_problems(page, name) if not CLOCK_FRACTION.search(problem)
    ]


def progress_box(page: Any) -> dict[str, str]:
    """The job page's progress box as shown: each visible cell's text by its data-field."""
    cells = page.locator("#rj-job dl.rj-counts div:not([hidden]) dd[data-field]")
    return {cell.get_attribute("data-field"): cell.inner_text().strip() for cell in cells.all()}


def progress_box_problems(box: dict[str, str], where: str) -> list[str]:
    """A figure in the progress box that is neither a count nor carries its unit."""
    problems = []
    for field, text in box.items():
        if text in ("", "—") or field == "status_display":
            continue
        if field in COUNT_FIELDS:
            ok = COUNT.match(text)
        elif field == "done_text":
            ok = DONE.match(text)
        elif field in RATE_FIELDS:
            # pace_text may say why there is no pace yet, in words without a figure
            ok = RATE.search(text) or not re.search(r"\d", text)
        elif field in DURATION_FIELDS:
            ok = DURATION.match(text)
        elif field in ("started", "finished"):
            ok = MOMENT.search(text)
        else:  # a note (eta_note and the like): words, with a unit after any figure
            ok = not re.search(r"\d", text) or UNIT.search(text)
        if not ok:
            problems.append(f"{where}: [data-field={field}] reads {text!r}")
    return problems


def test_a_new_operator_walks_from_the_root_to_run_again(
    live_server, services_redis, sandbox, start_worker, unique_name, browser_page, screenshot
):
    # given an API the sandbox throttles, a worker, and a job on it just submitted
    server = sandbox(rate=SANDBOX_RATE, burst=1, headers="github")
    api = api_create(name=unique_name, base_url=server.url, rate=50, burst=4, adaptive=True)
    operator = get_user_model().objects.create_superuser("operator", password=PASSWORD)
    start_worker(concurrency=2)
    base = live_server.url
    page = browser_page
    page.set_viewport_size({"width": WIDTHS[0], "height": HEIGHTS[WIDTHS[0]]})
    log_in(page, base)
    job = job_create(
        owner=operator, api=api, name="walked through",
        calls=[{"path": f"/items/{i}"} for i in range(CALLS)],
    )  # fmt: skip
    problems: list[str] = []

    # expect: the site's root is no 404 but the console's overview
    response = page.goto(f"{base}/")
    assert response is not None and response.ok, response and response.status
    assert page.url == f"{base}/overview/"
    expect(page.locator("#rj-overview")).to_be_visible()
    problems += look(page, screenshot, "root")

    # and the admin's home is the overview too, listing the job as it runs
    page.goto(f"{base}/admin/")
    running_row = page.locator(f'table#rj-overview-jobs tr[data-job="{job.pk}"]')
    expect(running_row).to_be_visible()
    problems += look(page, screenshot, "overview-running")

    # when the operator follows the job's name to its page, while it runs
    running_row.locator("th a").click()
    page.wait_for_url(f"**/admin/ratejobs/job/{job.pk}/change/")
    expect(page.locator('[data-field="status_display"]')).to_have_text(re.compile("Queued|Running"))
    box = progress_box(page)
    problems += progress_box_problems(box, "job page, running")
    problems += look(page, screenshot, "job-running") + field_problems(page, "job page, running")

    # then the page fills up on its own until the job is final
    page.locator('#rj-job[data-final="true"]').wait_for(timeout=FINAL_WITHIN_MS)
    expect(page.locator('[data-field="status_display"]')).to_have_text("Completed")
    box = progress_box(page)
    problems += progress_box_problems(box, "job page, final")
    problems += look(page, screenshot, "job-final") + field_problems(page, "job page, final")
    job.refresh_from_db()
    succeeded, failed, cancelled = (number(box[f]) for f in ("succeeded", "failed", "cancelled"))
    assert (succeeded, failed, cancelled) == (job.succeeded, job.failed, job.cancelled)
    assert number(box["throttled"]) == job.throttled > 0, box
    done = DONE.match(box["done_text"])
    assert done, box
    assert number(done["ran"]) + number(done["cancelled"] or "0") == succeeded + failed + cancelled
    assert number(done["total"]) == CALLS == job.total
    # and the counts by status code, final now, add up to the calls that got an answer
    links = page.locator("[data-calls-links]")
    assert "so far" not in links.inner_text()
    codes = {}
    for text in links.locator("a").all_inner_texts():
        if match := CODE_LINK.match(text.strip()):
            codes[match["code"]] = number(match["count"])
    answered = Call.objects.filter(job=job, status_code__isnull=False).count()
    assert sum(codes.values()) == answered == succeeded + failed, (codes, box)

    # and the overview's numbers for the job are the page's
    page.goto(f"{base}/admin/")
    finished_row = page.locator(f'tr[data-job="{job.pk}"][data-outcome]')
    expect(finished_row).to_be_visible()
    shown = {
        field: number(finished_row.locator(f"[data-field={field}]").inner_text())
        for field in ("total", "succeeded", "failed", "cancelled", "throttled")
    }
    assert shown == {
        "total": CALLS, "succeeded": succeeded, "failed": failed, "cancelled": cancelled,
        "throttled": number(box["throttled"]),
    }, shown  # fmt: skip
    problems += look(page, screenshot, "overview-finished")

    # when the operator opens the job's calls from its page
    page.goto(f"{base}/admin/ratejobs/job/{job.pk}/change/")
    page.locator("[data-calls-links] a", has_text="All calls").click()
    page.wait_for_url("**/admin/ratejobs/call/?*")
    expect(page.locator("#result_list tbody tr")).to_have_count(CALLS)
    problems += look(page, screenshot, "calls")

    # and one that was sent several times, from the list
    retried = (
        Call.objects.filter(job=job, throttled_count__gt=0).order_by("-throttled_count").first()
    )
    assert retried is not None, "no call of the job met a 429"
    page.locator(f'#result_list a[href*="/ratejobs/call/{retried.pk}/change/"]').click()
    page.wait_for_url(f"**/admin/ratejobs/call/{retried.pk}/change/**")
    # expect: its Attempts table, a row an attempt, a 429 with its Retry-After among them
    rows = page.locator("table.rj-attempts tbody tr")
    assert rows.count() >= 2 and rows.count() == CallAttempt.objects.filter(call=retried).count()
    throttled = rows.filter(has=page.locator("td:nth-child(4)", has_text="429")).first
    retry_after = throttled.locator("td:nth-child(7)").inner_text().strip()
    assert retry_after.isdigit() and int(retry_after) >= 1, throttled.inner_text()
    problems += look(page, screenshot, "call-attempts")

    # and the API's page, whose "rate now" is one sentence with the rate and its unit
    page.goto(f"{base}/admin/ratejobs/api/{api.pk}/change/")
    rate_now = page.locator("#rj-limiter table.rj-state tr:has(th:text-is('rate now')) td")
    sentence = rate_now.inner_text().strip()
    assert re.search(r"\d(?:\.\d+)?/s", sentence), sentence
    assert re.match(r"(holding|probing at|cut to|\d)", sentence), sentence
    problems += look(page, screenshot, "api")

    # and, a superuser though they are, a call and a throttle event are not deleted one at a
    # time: their delete pages refuse, and the rows stay
    event = ThrottleEvent.objects.filter(job=job).first()
    assert event is not None
    for url in (
        f"/admin/ratejobs/call/{retried.pk}/delete/",
        f"/admin/ratejobs/throttleevent/{event.pk}/delete/",
    ):
        assert page.goto(base + url).status == 403, url
    assert Call.objects.filter(pk=retried.pk).exists()
    assert ThrottleEvent.objects.filter(pk=event.pk).exists()

    # when the operator runs the finished job again, all its calls
    page.goto(f"{base}/admin/ratejobs/job/{job.pk}/change/")
    page.get_by_label("all calls").check()
    page.get_by_role("button", name="Run again").click()
    # expect: the new job's page, saying what was made
    page.wait_for_url(re.compile(rf"/admin/ratejobs/job/(?!{job.pk}/)\d+/change/"))
    clone = Job.objects.exclude(pk=job.pk).get()
    assert page.url.endswith(f"/admin/ratejobs/job/{clone.pk}/change/")
    expect(page.locator(".messagelist .success")).to_contain_text(f"{CALLS} calls")
    assert clone.total == CALLS
    problems += look(page, screenshot, "run-again")

    # and no page scrolled sideways or showed a figure an operator could misread
    assert not problems, "\n".join(problems)
