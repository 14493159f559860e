"""The admin's overview page: what every API and job is doing now, and what needs attention.
It polls its own JSON endpoint, which answers with the same figures and the page's sections
rendered again, so the page and its refreshes share one renderer."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from html import unescape
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, JsonResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join, strip_tags
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.timezone import localtime

from ratejobs.admin.access import is_staff
from ratejobs.admin.apis import per_period_text
from ratejobs.admin.charts import nice_ticks
from ratejobs.admin.jobs import progress_bar
from ratejobs.limiter import LimiterState
from ratejobs.limiter.core import WindowState
from ratejobs.models import Job
from ratejobs.selectors.jobs import job_done_text, job_outcome, job_pace_text
from ratejobs.selectors.overview import (
    IN_PROGRESS,
    RECENTLY_FINISHED_SECONDS,
    TRAFFIC_BUCKET_SECONDS,
    TRAFFIC_SECONDS,
    ApiOverview,
    ApiTraffic,
    JobOverview,
    Overview,
    StuckCalls,
    overview_for_user,
)
from ratejobs.text import (
    clock_text,
    duration_text,
    in_flight_text,
    moment_text,
    rate_text,
    throttle_event_text,
)

# The page polls every REFRESH_SECONDS (overview.js reads it from the page).
REFRESH_SECONDS = 2
SECTION_TEMPLATES = {
    "apis": "admin/ratejobs/overview/apis.html",
    "jobs": "admin/ratejobs/overview/jobs.html",
    "finished": "admin/ratejobs/overview/finished.html",
    "attention": "admin/ratejobs/overview/attention.html",
}


# --- figures as an operator reads them ---------------------------------------------------


def when_text(moment: datetime, now: datetime) -> str:
    """A time to the second ("14:03:27"), with its date when that is not today."""
    same_day = localtime(moment).date() == localtime(now).date()
    return clock_text(moment) if same_day else moment_text(moment)


def blocked_for_text(seconds: float) -> str:
    """How long a block still lasts, in whole seconds rounded up: "1 s" until it ends."""
    return duration_text(math.ceil(seconds))


def window_left_text(state: WindowState) -> str:
    """One window as the overview shows it: "212 of 300 per 60 s left"."""
    window = state.window
    unit = " cost" if window.unit == "cost" else ""
    left = max(0, int(state.remaining))
    if window.burst == window.rate:
        return f"{left:,} of {window.rate:,g}{unit} per {window.period:g} s left"
    return f"{left:,} of {window.burst:,} left ({window.rate:,g}{unit} per {window.period:g} s)"


def current_rate_text(state: LimiterState) -> str:
    """ "11.9/s of 20/s": the measured rate to a tenth, the configured ceiling as given."""
    current = rate_text(state.current_rate / state.period)
    return f"{current} of {per_period_text(state.rate / state.period, 1)}"


def blocked_text(item: ApiOverview, now: datetime) -> str:
    if item.blocked_for <= 0:
        return "—"
    until = now + timedelta(seconds=item.blocked_for)
    return f"blocked until {when_text(until, now)} ({blocked_for_text(item.blocked_for)})"


# --- the sparkline -------------------------------------------------------------------------

SPARK_W, SPARK_H = 150, 34  # the plot's width; the SVG is SPARK_SCALE_W wider
SPARK_PLOT_H = 27  # above it, a strip for the 429 marks
SPARK_MARK_H = 4
# Left of the plot, its scale: the top's calls/s and the baseline's 0 (room for "2500/s").
SPARK_SCALE_W = 38


def sparkline_top(highest: float) -> float:
    """The calls/s at the top of the sparkline: a round value at or above `highest` (its
    label reads "20/s", not "18.73/s"); 1/s for an idle API."""
    return nice_ticks(highest * 1.05, 2)[-1] if highest > 0 else 1.0


def count_text(count: int, unit: str) -> str:
    """ "1 call", "500 calls": a count always says what it counts."""
    return f"{count:,} {unit}{'' if count == 1 else 's'}"


def sparkline_svg(traffic: ApiTraffic, ceiling_per_second: float | None) -> SafeString:
    """Calls/s of the last 5 minutes in 10 s bars, red marks under the buckets that got 429s,
    and the ceiling as a dashed line when the API's limiter could be read."""
    rates = traffic.calls_per_second
    top = sparkline_top(max(max(rates, default=0.0), ceiling_per_second or 0.0))
    bar_w = SPARK_W / len(rates)
    left = SPARK_SCALE_W

    def y(value: float) -> float:
        return SPARK_PLOT_H - value / top * SPARK_PLOT_H

    bars = format_html_join(
        "",
        '<rect class="rj-bar" x="{}" y="{}" width="{}" height="{}"/>',
        (
            (
                f"{left + i * bar_w:.1f}",
                f"{y(rate):.1f}",
                f"{bar_w - 1:.1f}",
                f"{SPARK_PLOT_H - y(rate):.1f}",
            )
            for i, rate in enumerate(rates)
            if rate > 0
        ),
    )
    marks = format_html_join(
        "",
        '<rect class="rj-429" x="{}" y="{}" width="{}" height="{}"><title>{} × 429</title></rect>',
        (
            (
                f"{left + i * bar_w:.1f}",
                SPARK_H - SPARK_MARK_H,
                f"{bar_w - 1:.1f}",
                SPARK_MARK_H,
                count,
            )
            for i, count in enumerate(traffic.throttled)
            if count
        ),
    )
    ceiling = (
        format_html(
            '<line class="rj-limit" x1="{l}" y1="{y}" x2="{w}" y2="{y}"/>',
            l=left,
            y=f"{y(ceiling_per_second):.1f}",
            w=left + SPARK_W,
        )
        if ceiling_per_second
        else ""
    )
    summary = (
        f"calls/s over the last {TRAFFIC_SECONDS // 60} min in {TRAFFIC_BUCKET_SECONDS} s "
        f"buckets (scale 0 to {top:g}/s): peak {rate_text(max(rates, default=0.0))}, "
        f"{traffic.throttles} × 429"
    )
    return format_html(
        '<svg class="rj-sparkline" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="{summary}" xmlns="http://www.w3.org/2000/svg"><title>{summary}</title>'
        '<text class="rj-spark-scale" x="{lx}" y="7" text-anchor="end">{top}</text>'
        '<text class="rj-spark-scale" x="{lx}" y="{base}" text-anchor="end">0</text>'
        '<line class="rj-axis" x1="{l}" y1="0" x2="{l}" y2="{base}"/>'
        '<line class="rj-axis" x1="{l}" y1="{base}" x2="{w}" y2="{base}"/>{bars}{ceiling}{marks}'
        "</svg>",
        w=left + SPARK_W,
        h=SPARK_H,
        l=left,
        lx=left - 3,
        top=f"{top:g}/s",
        base=SPARK_PLOT_H,
        summary=summary,
        bars=bars,
        ceiling=ceiling,
        marks=marks,
    )


# --- rows and items --------------------------------------------------------------------------


def api_row(item: ApiOverview, now: datetime) -> dict[str, Any]:
    """An API's row: each cell's text (the JSON's figures too) and its sparkline."""
    state = item.reading.state
    return {
        "name": item.api.name,
        "url": reverse("admin:ratejobs_api_change", args=[item.api.pk]),
        "error": item.reading.error,
        "current_rate": item.reading.error if state is None else current_rate_text(state),
        "current_rate_per_second": None if state is None else state.current_rate / state.period,
        "ceiling_per_second": None if state is None else state.rate / state.period,
        "windows": [] if state is None else [window_left_text(w) for w in state.windows],
        "blocked": blocked_text(item, now),
        "is_blocked": item.blocked_for > 0,
        "blocked_for": round(item.blocked_for, 1),
        "in_flight": "—" if state is None else in_flight_text(state),
        # 429s are refused attempts of calls, not calls: counted apart, each labelled, and the
        # requests the API answered (both) only under their own name.
        "throttles_5m": item.traffic.throttles,
        "throttles_5m_text": f"{item.traffic.throttles:,} × 429",
        "calls_finished_5m": item.traffic.finished_calls,
        "calls_finished_5m_text": count_text(item.traffic.finished_calls, "call"),
        "requests_5m": item.traffic.sent,
        "calls_per_second": item.traffic.calls_per_second,
        "throttled": list(item.traffic.throttled),
        "sparkline": sparkline_svg(
            item.traffic, None if state is None else state.rate / state.period
        ),
    }


def job_row(item: JobOverview) -> dict[str, Any]:
    """A job in progress; pace and ETA only when they can be measured (a running job), else
    what stands in for them ("paused", "starts at …"), which the page shows under another
    data-field so that a cell named "pace" or "eta" always holds a rate or a duration."""
    job = item.job
    pace_text = job_pace_text(job, item.pace)
    return {
        "id": job.pk,
        "name": job.name,
        "url": reverse("admin:ratejobs_job_change", args=[job.pk]),
        "api": job.api.name,
        "status": job.status,
        "status_display": job_outcome(job).label,
        "done_text": job_done_text(job),
        "progress": round(job.progress * 100, 1),
        "progress_bar": progress_bar(job),
        "done": job.done,
        "total": job.total,
        "pace": round(item.pace, 2),
        "pace_text": pace_text,
        "pace_is_rate": pace_text.endswith("/s"),
        "eta": item.eta_text,
        "eta_seconds": None if item.eta_seconds is None else round(item.eta_seconds, 1),
    }


def finished_row(job: Job, now: datetime) -> dict[str, Any]:
    """A job that ended lately: how (job_outcome: a completed job with failed or unsent calls
    never reads as a success), when, and what its calls came to."""
    outcome = job_outcome(job)
    return {
        "id": job.pk,
        "name": job.name,
        "url": reverse("admin:ratejobs_job_change", args=[job.pk]),
        "api": job.api.name,
        "outcome": outcome.key,
        "outcome_display": outcome.label,
        "finished": when_text(job.finished, now) if job.finished else "—",
        "total": job.total,
        "succeeded": job.succeeded,
        "failed": job.failed,
        "cancelled": job.cancelled,
        "throttled": job.throttled,
        "total_text": count_text(job.total, "call"),
        "succeeded_text": count_text(job.succeeded, "call"),
        "failed_text": count_text(job.failed, "call"),
        "cancelled_text": count_text(job.cancelled, "call"),
        "throttled_text": f"{job.throttled:,} × 429",
    }


def _failed_calls_url(job: Job) -> str:
    query = urlencode({"job": job.pk, "outcome": "failed"})
    return f"{reverse('admin:ratejobs_call_changelist')}?{query}"


def _block_reason_text(item: ApiOverview, now: datetime) -> str:
    event = item.block_reason
    if event is None:
        return "no throttle event recorded (blocked by another deployment, or by hand in Redis)"
    return (
        f"{throttle_event_text(event, period=item.api.period)}, at {when_text(event.created, now)}"
    )


def attention_items(overview: Overview) -> list[dict[str, Any]]:
    """What an operator should look at, most urgent first; each with its kind and its HTML."""
    now = overview.now
    items: list[tuple[str, SafeString]] = []
    for item in overview.blocked_apis:
        items.append((
            "blocked",
            format_html(
                '<a href="{}">{}</a> is blocked until {} ({} from now): {}',
                reverse("admin:ratejobs_api_change", args=[item.api.pk]),
                item.api.name,
                when_text(now + timedelta(seconds=item.blocked_for), now),
                blocked_for_text(item.blocked_for),
                _block_reason_text(item, now),
            ),
        ))  # fmt: skip
    if overview.workers_missing:
        seen = overview.workers_last_seen
        items.append((
            "workers",
            format_html(
                "No worker seen since {} ({} ago) while jobs wait to run: are the Celery "
                "workers up?",
                when_text(seen, now),
                duration_text((now - seen).total_seconds()),
            )
            if seen is not None
            else format_html(
                "{}",
                "No worker has ever sent a heartbeat while jobs wait to run: start the Celery "
                "workers.",
            ),
        ))  # fmt: skip
    for stuck in overview.stuck:
        items.append(("stuck", _stuck_text(stuck)))
    for job in overview.failed_jobs:
        when = (
            f"{job_outcome(job).label.lower()} at {when_text(job.finished, now)}"
            if job.finished and job.status not in IN_PROGRESS
            else job_outcome(job).label.lower()
        )
        items.append((
            "failures",
            format_html(
                '<a href="{}">{}</a> ({}, {}): {} failed call{} · <a href="{}">see them</a>',
                reverse("admin:ratejobs_job_change", args=[job.pk]),
                job.name,
                job.api.name,
                when,
                job.failed,
                "" if job.failed == 1 else "s",
                _failed_calls_url(job),
            ),
        ))  # fmt: skip
    if overview.failed_jobs_not_shown:
        items.append((
            "failures",
            format_html("and {} more jobs with failed calls", overview.failed_jobs_not_shown),
        ))  # fmt: skip
    return [
        {"kind": kind, "html": html, "text": unescape(strip_tags(html))} for kind, html in items
    ]


def _stuck_text(stuck: StuckCalls) -> SafeString:
    parts = []
    if stuck.running:
        parts.append(
            f"{stuck.running} call{'' if stuck.running == 1 else 's'} running past their claim "
            "or on a worker gone silent (the workers' sweep should have taken them back)"
        )
    if stuck.not_started:
        parts.append(
            f"{stuck.not_started} call{'' if stuck.not_started == 1 else 's'} sent to the "
            "broker long ago and never started (is celery beat running the reconciler?)"
        )
    return format_html("{}: {}", stuck.api_name, "; ".join(parts))


# --- views ---------------------------------------------------------------------------------


def overview_context(request: HttpRequest) -> dict[str, Any]:
    overview = overview_for_user(request.user)
    return {
        "refreshed": overview.now.isoformat(),
        "refreshed_text": when_text(overview.now, overview.now),
        "apis": [api_row(item, overview.now) for item in overview.apis],
        "jobs": [job_row(item) for item in overview.jobs],
        "jobs_not_shown": overview.jobs_not_shown,
        "jobs_list_url": reverse("admin:ratejobs_job_changelist"),
        "finished_jobs": [finished_row(job, overview.now) for job in overview.finished_jobs],
        "finished_jobs_not_shown": overview.finished_jobs_not_shown,
        "finished_minutes": RECENTLY_FINISHED_SECONDS // 60,
        "attention": attention_items(overview),
    }


def _require_staff(request: HttpRequest) -> None:
    if not is_staff(request):
        raise PermissionDenied


def overview_view(request: HttpRequest) -> TemplateResponse:
    _require_staff(request)
    context = {
        **admin.site.each_context(request),
        **overview_context(request),
        "title": "Overview",
        "subtitle": "What every API and job is doing now",
        "data_url": reverse("ratejobs_overview_data"),
        "refresh_seconds": REFRESH_SECONDS,
    }
    return TemplateResponse(request, "admin/ratejobs/overview.html", context)


def overview_data_view(request: HttpRequest) -> JsonResponse:
    """The page's figures, and its sections rendered again for overview.js."""
    _require_staff(request)
    context = overview_context(request)
    html = {
        section: render_to_string(template, context, request=request)
        for section, template in SECTION_TEMPLATES.items()
    }
    apis = [{k: v for k, v in row.items() if k != "sparkline"} for row in context["apis"]]
    jobs = [{k: v for k, v in row.items() if k != "progress_bar"} for row in context["jobs"]]
    attention = [{"kind": item["kind"], "text": item["text"]} for item in context["attention"]]
    return JsonResponse({
        "refreshed": context["refreshed"],
        "refreshed_text": context["refreshed_text"],
        "apis": apis,
        "jobs": jobs,
        "jobs_not_shown": context["jobs_not_shown"],
        "finished_jobs": context["finished_jobs"],
        "finished_jobs_not_shown": context["finished_jobs_not_shown"],
        "attention": attention,
        "html": html,
    })  # fmt: skip
