"""What an operator sees through a run: the overview and the job page
while an adaptive API meets 429s, during and after a manual block, and after a cancel made
through its confirmation; a second job that ends with failures. Screenshots of each page at
1280 and 1920 px; every figure on each page carries a unit and a sensible precision.

Real parts only: the live Django server, a Celery worker, the broker and limiter in Redis, the
sandbox API enforcing less than it advertises, and Chromium.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from ratejobs.models import Call, Job
from ratejobs.selectors.apis import api_limiter_state
from ratejobs.services.apis import api_create
from ratejobs.services.jobs import job_create
from tests.browser.test_admin_in_browser import PASSWORD, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
expect = pytest.importorskip("playwright.sync_api").expect

NARROW = {"width": 1280, "height": 900}
WIDE = {"width": 1920, "height": 1080}
# The sandbox advertises 20/s and enforces 10/s; the API is configured at the advertised rate,
# so the adaptive limiter meets 429s in its first seconds. 400 calls at 10/s at most outlast the
# scenario (about 25 s), so the job is still running when it is cancelled.
ADVERTISED_RATE, REAL_RATE, CALLS = 20, 10, 400
BLOCK_SECONDS = 5
BLOCK, ONE_SECOND = timedelta(seconds=BLOCK_SECONDS), timedelta(seconds=1)
# The job page and the overview poll every 2 s; a change shows within one poll and a slow page.
POLL_MS = 2_000
SHOWS_WITHIN_MS = 3 * POLL_MS
FAILING_CALLS = 3

# A figure with a fraction must be followed by its unit (a rate range "13.9 → 12.1/s" counts
# as one figure with its unit at the end).
DECIMAL = re.compile(r"(?<![\d.])\d+\.\d+(?![\d.])")
UNIT_AFTER = re.compile(
    r"(?:\s?(?:→|–|-|to|of)\s?\d+(?:\.\d+)?)*\s?(?:ms|s|min|h|/s|/min|/h|%|×|[KMG]i?B|B|cost|per)"
    r"(?![A-Za-z])"
)
RAW_FLOAT = re.compile(r"(?<![\d.])\d+\.\d{4,}(?![\d.])")
# A time of day without its seconds: "8:25" alone, as in Django's default "8:25 a.m.".
TIME_WITHOUT_SECONDS = re.compile(r"(?<![\d:])\d{1,2}:\d{2}(?![\d:])")
DURATION = re.compile(r"^\d+(?:\.\d+)? ?(?:ms|s|min|h)(?: \d+(?:\.\d+)? ?(?:ms|s|min))?$")
RATE = re.compile(r"\d(?:\.\d+)? ?/s")
CLOCK = re.compile(r"\b(\d\d):(\d\d):(\d\d)\b")


def figure_problems(page: Any, where: str) -> list[str]:
    """What on the page's content an operator could misread: raw floats, fractions without a
    unit, times of day without seconds; each with its context, named by `where`."""
    text = page.inner_text("#content")
    problems = []

    def quote(match: re.Match[str], why: str) -> None:
        context = text[max(0, match.start() - 40) : match.end() + 20].replace("\n", " ⏎ ")
        problems.append(f"{where}: {why} {match.group()!r} in …{context}…")

    for match in RAW_FLOAT.finditer(text):
        quote(match, "raw float")
    for match in TIME_WITHOUT_SECONDS.finditer(text):
        quote(match, "time without seconds")
    for match in DECIMAL.finditer(text):
        if not RAW_FLOAT.fullmatch(match.group()) and not UNIT_AFTER.match(text, match.end()):
            quote(match, "figure without a unit")
    return problems


def field_problems(page: Any, where: str) -> list[str]:
    """The figures named by data-field: rates read "…/s" (in their cell), durations carry a
    unit."""
    problems = []
    for field in ("pace", "average_rate", "current_rate"):
        for cell in page.locator(f"[data-field={field}]").all():
            # the unit may sit beside the figure, in the same cell
            text = cell.evaluate("el => (el.closest('td, dd') || el).innerText").strip()
            if text not in ("", "—") and not RATE.search(text):
                problems.append(f"{where}: [data-field={field}] reads {text!r}, no /s")
    for field in ("duration", "eta"):
        for cell in page.locator(f"[data-field={field}]").all():
            text = cell.inner_text().strip()
            if text not in ("", "—") and not DURATION.match(text):
                problems.append(f"{where}: [data-field={field}] reads {text!r}, no duration unit")
    return problems


def clock_moment(shown: str, near: datetime) -> datetime:
    """The moment nearest to `near` whose time of day (in the admin's time zone) is the first
    HH:MM:SS in `shown`."""
    hours, minutes, seconds = (int(part) for part in CLOCK.search(shown).groups())
    local = timezone.localtime(near)
    moment = local.replace(hour=hours, minute=minutes, second=seconds, microsecond=0)
    day = timedelta(days=1)
    return min((moment - day, moment, moment + day), key=lambda m: abs(m - local))


def wait_until_no_call_runs(job: Job, timeout: float = 10.0) -> None:
    """Calls on the wire when a job is cancelled still finish, and their 429s still count."""
    deadline = time.monotonic() + timeout
    while Call.objects.filter(job=job, status=Call.Status.RUNNING).exists():
        assert time.monotonic() < deadline, f"calls of job {job.pk} still running"
        time.sleep(0.2)


def another_page(page: Any) -> Any:
    """A page in a context of its own, at 1280 px, logged in as `page` is (a page opened by
    browser.new_page owns its context and can have no sibling)."""
    context = page.context.browser.new_context(
        viewport=NARROW, storage_state=page.context.storage_state()
    )
    other = context.new_page()
    other.set_default_timeout(30_000)
    return other


def test_an_operator_follows_a_run_through_429s_a_manual_block_and_a_cancel(
    live_server, services_redis, sandbox, start_worker, unique_name, browser_page, screenshot
):
    # given an adaptive API configured at what a sandbox advertises, which enforces half of it,
    # a worker, a long job on it that meets 429s, and a short job whose calls partly fail
    server = sandbox(rate=ADVERTISED_RATE, real_rate=REAL_RATE, burst=2, headers="none")
    api = api_create(
        name=unique_name, base_url=server.url, rate=ADVERTISED_RATE, burst=1, adaptive=True
    )
    operator = get_user_model().objects.create_superuser("operator", password=PASSWORD)
    start_worker(concurrency=2)
    job = job_create(
        owner=operator, api=api, name="meets 429s",
        calls=[{"path": f"/items/{i}"} for i in range(CALLS)],
    )  # fmt: skip
    # and on an API that never throttles, so that nothing above delays it: 404s fail at once
    answers_at_once = api_create(
        name=f"{unique_name}-b",
        base_url=sandbox(no_limit=True, headers="none").url,
        rate=50,
        burst=5,
    )
    failing = job_create(
        owner=operator, api=answers_at_once, name="some calls fail",
        calls=[{"path": "/status/404" if i < FAILING_CALLS else f"/ok/{i}"} for i in range(10)],
    )  # fmt: skip
    base = live_server.url
    overview = browser_page
    overview.set_viewport_size(NARROW)
    log_in(overview, base)
    page = another_page(overview)
    problems: list[str] = []

    # expect: the overview lists the API and the running job, and counts the 429s as they come
    overview.goto(f"{base}/overview/")
    api_row = overview.locator(f'table#rj-overview-apis tr[data-api="{unique_name}"]')
    expect(api_row).to_be_visible()
    first_refresh = overview.locator("#rj-overview").get_attribute("data-refreshed")
    expect(overview.locator(f'table#rj-overview-jobs tr[data-job="{job.pk}"]')).to_be_visible()
    expect(api_row.locator("[data-field=throttles_5m]")).to_have_text(
        re.compile(r"(?<![\d.])[1-9]"), timeout=15_000
    )
    assert api_row.locator("svg.rj-sparkline").count() == 1
    for field in ("current_rate", "windows", "blocked", "in_flight", "calls_finished_5m"):
        assert api_row.locator(f"[data-field={field}]").count() == 1, field
    # and it refreshed itself meanwhile, without a reload
    expect(overview.locator("#rj-overview")).not_to_have_attribute(
        "data-refreshed", first_refresh or "", timeout=SHOWS_WITHIN_MS
    )
    problems += figure_problems(overview, "overview") + field_problems(overview, "overview")
    print("overview:", screenshot(overview, "overview-1280"))
    overview.set_viewport_size(WIDE)
    print("overview:", screenshot(overview, "overview-1920"))

    # and the job page, open before the block, shows each 429 as one event row with its effect
    page.goto(f"{base}/admin/ratejobs/job/{job.pk}/change/")
    expect(page.locator('[data-field="status_display"]')).to_have_text("Running")
    expect(page.locator("#rj-events tbody tr").first).to_be_visible(timeout=SHOWS_WITHIN_MS)
    assert page.locator("#rj-chart svg").count() == 1
    page.evaluate("window.notReloaded = true")

    # when the operator blocks the API for a few seconds from its page, through a confirmation
    api_page = another_page(overview)
    api_page.goto(f"{base}/admin/ratejobs/api/{api.pk}/change/")
    problems += figure_problems(api_page, "API page")
    api_page.fill("input[name=seconds]", str(BLOCK_SECONDS))
    api_page.click("#rj-block-button")
    expect(api_page.locator("#content h1").first).to_have_text("Are you sure?")
    summary = api_page.inner_text("#content")
    assert re.search(rf"\b{BLOCK_SECONDS}(\.0+)? ?(s|seconds)\b", summary), summary
    print("block confirmation:", screenshot(api_page, "confirm-block-1280"))
    confirmed = timezone.now()
    api_page.click("#content input[type=submit][value^=Yes]")
    api_page.wait_for_url(f"**/admin/ratejobs/api/{api.pk}/change/")
    expect(api_page.locator(".messagelist")).to_be_visible()
    block_ends = (confirmed + BLOCK, timezone.now() + BLOCK)
    assert api_limiter_state(api).blocked_for > BLOCK_SECONDS - 2
    api_page.close()

    # expect: the job page, without a reload, shows a banner saying until when and why
    banner = page.locator("#rj-block-banner")
    expect(banner).to_be_visible(timeout=SHOWS_WITHIN_MS)
    expect(banner).to_contain_text("manual block", timeout=SHOWS_WITHIN_MS)
    expect(banner).to_contain_text("blocked until")
    # and the chart, redrawn in the poll that brought the banner, shades the block: grey, as
    # another's (an operator's), alone or joined to other such blocks it overlaps; this job's
    # own 429s are spans of their own, which may start later
    operators = page.locator("#rj-chart rect.rj-block-other title").filter(
        has_text=re.compile(r"manual block by an operator|more blocks?\)$")
    )
    expect(operators.first).to_be_attached(timeout=1_000)
    # (a clock shows whole seconds)
    until = clock_moment(banner.inner_text(), block_ends[0])
    assert block_ends[0] - ONE_SECOND <= until <= block_ends[1] + ONE_SECOND, banner.inner_text()
    problems += figure_problems(page, "job page, blocked") + field_problems(page, "job page")
    print("job page, blocked:", screenshot(page, "job-page-blocked-1280"))

    # and the overview, refreshing itself, shows the block in the API's row and as attention
    blocked_cell = api_row.locator("[data-field=blocked]")
    expect(blocked_cell).to_have_class(re.compile(r"\brj-blocked\b"), timeout=SHOWS_WITHIN_MS)
    expect(blocked_cell).to_have_text(re.compile(r"blocked until \d\d:\d\d:\d\d \(\d+(\.\d)? s\)"))
    expect(overview.locator("ul#rj-attention li[data-kind=blocked]")).to_contain_text(
        "manual block"
    )
    problems += figure_problems(overview, "overview, blocked")
    overview.set_viewport_size(NARROW)
    print("overview, blocked:", screenshot(overview, "overview-blocked-1280"))

    # and the banner goes once the block is over, still without a reload
    expect(banner).to_be_hidden(timeout=BLOCK_SECONDS * 1000 + SHOWS_WITHIN_MS)
    expect(blocked_cell).not_to_have_class(re.compile(r"\brj-blocked\b"), timeout=SHOWS_WITHIN_MS)
    assert page.evaluate("window.notReloaded") is True

    # when the operator asks to cancel and then takes it back, nothing is cancelled
    page.click('button[data-action="cancel"]')
    expect(page.locator("#content h1").first).to_have_text("Are you sure?")
    problems += figure_problems(page, "cancel confirmation")
    print("cancel confirmation:", screenshot(page, "confirm-cancel-1280"))
    expect(page.locator("a.cancel-link")).to_have_text("No, take me back")
    page.click("a.cancel-link")
    page.wait_for_url(f"**/admin/ratejobs/job/{job.pk}/change/**")
    expect(page.locator('[data-field="status_display"]')).to_have_text("Running")
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING

    # and when the operator confirms the cancel, the job ends as cancelled
    page.click('button[data-action="cancel"]')
    page.click("#content input[type=submit][value^=Yes]")
    page.wait_for_url(f"**/admin/ratejobs/job/{job.pk}/change/**")
    expect(page.locator(".messagelist")).to_contain_text("cancelled")
    status = page.locator('[data-field="status_display"]')
    expect(status).to_have_text("Cancelled", timeout=SHOWS_WITHIN_MS)
    page.locator('#rj-job[data-final="true"]').wait_for(timeout=SHOWS_WITHIN_MS)
    assert Job.objects.get(pk=job.pk).status == Job.Status.CANCELLED
    expect(page.locator('[data-field="duration"]')).to_have_text(DURATION)
    expect(page.locator('[data-field="average_rate"]')).to_have_text(RATE)
    # and its events, read again once no call is on the wire, give each 429 one row that says
    # what it did to the rate (cut or unchanged; a handful of 429s here, all on one page)
    wait_until_no_call_runs(job)
    page.reload()
    throttles = page.locator("#rj-events tbody tr", has_text="429 received")
    assert throttles.count() == Job.objects.get(pk=job.pk).throttled > 0
    for row in throttles.all_inner_texts():
        assert re.search(r"rate \d+(\.\d+)?/s", row), row
    problems += figure_problems(page, "job page, cancelled")
    problems += field_problems(page, "job page, cancelled")
    print("job page, cancelled:", screenshot(page, "job-page-cancelled-1280"))
    page.set_viewport_size(WIDE)
    print("job page, cancelled:", screenshot(page, "job-page-cancelled-1920"))

    # expect: the short job reads "Completed with failures", and the overview asks to look at it
    page.goto(f"{base}/admin/ratejobs/job/{failing.pk}/change/")
    expect(page.locator('[data-field="status_display"]')).to_have_text(
        "Completed with failures", timeout=SHOWS_WITHIN_MS
    )
    failing.refresh_from_db()
    assert (failing.failed, failing.succeeded) == (FAILING_CALLS, 10 - FAILING_CALLS), vars(failing)
    problems += figure_problems(page, "job page, failures")
    problems += field_problems(page, "job page, failures")
    print("job page, failures:", screenshot(page, "job-page-failures-1920"))
    page.set_viewport_size(NARROW)
    print("job page, failures:", screenshot(page, "job-page-failures-1280"))
    expect(overview.locator("ul#rj-attention li[data-kind=failures]")).to_contain_text(
        failing.name, timeout=SHOWS_WITHIN_MS
    )

    # and the lists read like a report too
    for where, url in (
        ("job list", "/admin/ratejobs/job/"),
        ("API list", "/admin/ratejobs/api/"),
        ("call list", f"/admin/ratejobs/call/?job={job.pk}"),
        ("throttle event list", "/admin/ratejobs/throttleevent/"),
    ):
        page.goto(base + url)
        problems += figure_problems(page, where)

    # and no page showed a figure an operator could misread
    assert not problems, "\n".join(problems)
