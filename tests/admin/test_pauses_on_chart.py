"""The job page marks when the job sat paused (issue 26): a hatched band over the chart, apart
from the API's block shading, named in its title and in the legend as "paused"; and its
duration and average rate leave that time out. Django's test client, real database and Redis."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse

from ratejobs.infra.clock import database_now
from ratejobs.models import Job, JobSecond
from ratejobs.selectors.job_chart import job_chart
from ratejobs.services import jobs as job_services
from ratejobs.services.jobs import job_cancel, job_pause, job_resume
from ratejobs.text import clock_text

pytestmark = pytest.mark.django_db


def job_page(client: Any, job: Job) -> str:
    response = client.get(reverse("admin:ratejobs_job_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def progress(client: Any, job: Job) -> dict[str, Any]:
    return client.get(reverse("admin:ratejobs_job_progress", args=[job.pk]), {"chart": 1}).json()


def legend(html: str) -> list[str]:
    (group,) = re.findall(r'<g class="rj-legend">(.*?)</g></svg>', html)
    return re.findall(r'<text class="rj-tick"[^>]*>([^<]*)</text>', group)


@pytest.fixture
def paused_job(
    make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> tuple[Job, datetime]:
    """A job started two minutes ago that ran 30 s, sat paused 60 s, ran 30 s and was cancelled,
    with 120 calls ended."""
    start = database_now().replace(microsecond=0) - timedelta(seconds=120)
    job = make_job(calls=200)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started=start, succeeded=120)
    for second in (*range(0, 30), *range(90, 120)):
        JobSecond.objects.create(job=job, at=start + timedelta(seconds=second), calls=2)
    moment: list[datetime] = []
    monkeypatch.setattr(job_services, "database_now", lambda: moment[-1])
    for offset, act in ((30, job_pause), (90, job_resume), (120, job_cancel)):
        moment.append(start + timedelta(seconds=offset))
        job = act(job=job)
    return job, start


def test_the_chart_hatches_the_pause_and_names_it_in_the_legend(root_client, paused_job):
    job, start = paused_job
    html = job_page(root_client, job)

    (band,) = re.findall(r'<rect class="rj-paused" [^>]*><title>([^<]*)</title></rect>', html)
    began, ended = start + timedelta(seconds=30), start + timedelta(seconds=90)
    assert band == f"paused {clock_text(began)} → {clock_text(ended)} (1 min 00 s)"
    assert 'fill="url(#rj-paused-hatch)"' in html and '<pattern id="rj-paused-hatch"' in html
    assert "paused</text>" in html  # 60 s of 120 is wide enough to say so in the band
    assert "paused" in legend(html)
    # the block shading is another thing: this job was never blocked
    plot = re.search(r'<svg class="rj-chart".*?<g class="rj-legend">', html, re.S)
    assert plot is not None and "rj-block" not in plot.group(0)


def test_the_band_spans_the_pause_on_the_time_axis(paused_job):
    job, _ = paused_job
    chart = job_chart(job)
    ((begin, end),) = [(pause.start, pause.end) for pause in chart.pauses]
    assert (begin, end) == (pytest.approx(30.0), pytest.approx(90.0))


def test_the_job_page_figures_leave_the_pause_out(root_client, paused_job):
    job, _ = paused_job
    data = progress(root_client, job)
    # 120 s from start to cancel, 60 of them paused: 120 calls in 60 s
    assert data["duration"] == "1 min 00 s"
    assert data["average_rate"] == "2.0/s"
    assert 'class="rj-paused"' in data["chart"]


def test_a_pause_still_open_runs_to_the_end_of_the_chart(root_client, make_job):
    start = database_now() - timedelta(seconds=60)
    job = make_job(calls=10)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started=start)
    job = job_pause(job=job)

    html = job_page(root_client, job)

    (title,) = re.findall(r'<rect class="rj-paused" [^>]*><title>([^<]*)</title>', html)
    assert title.startswith("paused since ") and "so far" in title
    assert "paused" in legend(html)


def test_a_job_never_paused_has_no_band_and_no_legend_entry(root_client, make_job):
    job = make_job(calls=10)
    Job.objects.filter(pk=job.pk).update(
        status=Job.Status.RUNNING, started=database_now() - timedelta(seconds=30)
    )
    html = job_page(root_client, job)
    assert 'class="rj-paused"' not in html and "rj-paused-hatch" not in html
    assert "paused" not in legend(html)
