"""Finished jobs as workers leave them (calls with stored responses, throttle events, counts
per second), aged by moving their times back, for the retention and purge tests."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ratejobs.models import Call, Job, JobSecond, ThrottleEvent

BODY = b'{"ok": true}'


@pytest.fixture
def finished_job(make_job: Callable[..., Job]) -> Callable[..., Job]:
    """A job whose calls all got a response, finished `age_days` ago, with one throttle event
    per call and one count per second."""

    def make(
        calls: int = 5, *, age_days: float = 0, status: str = "completed", owner: Any = None
    ) -> Job:
        job = make_job(calls=calls, owner=owner)
        finished = timezone.now() - timedelta(days=age_days)
        Call.objects.filter(job=job).update(
            status=Call.Status.SUCCEEDED if status == "completed" else Call.Status.CANCELLED,
            status_code=200,
            response_body=BODY,
            response_headers={"Content-Type": "application/json"},
            response_truncated=True,
            started=finished,
            finished=finished,
        )
        Job.objects.filter(pk=job.pk).update(
            status=status, succeeded=calls, started=finished, finished=finished
        )
        for call in Call.objects.filter(job=job):
            event = ThrottleEvent.objects.create(api=job.api, job=job, call=call, kind="throttled")
            ThrottleEvent.objects.filter(pk=event.pk).update(created=finished)
        for second in range(2):
            JobSecond.objects.create(job=job, at=finished + timedelta(seconds=second), calls=1)
        job.refresh_from_db()
        return job

    return make
