"""Which block the job page names (ratejobs.selectors.job_chart): the one that holds the API
now, with its reason in an operator's words. The page around it is tested in
tests/admin/test_job_story.py."""

from __future__ import annotations

import pytest
from django.utils import timezone

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Job, ThrottleEvent
from ratejobs.selectors.job_chart import job_block_notice
from ratejobs.services.apis import api_block

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("services_redis")]


def running(job: Job) -> Job:
    Job.objects.filter(pk=job.pk).update(status="running", started=timezone.now())
    job.refresh_from_db()
    return job


def test_a_block_by_a_429_names_its_retry_after_and_call(make_job):
    job = running(make_job(calls=20))
    call = job.calls.get(index=17)
    api_limiter(job.api).block(5)
    ThrottleEvent.objects.create(
        api=job.api, job=job, call=call, kind="throttled", status_code=429, retry_after=5.0
    )
    assert job_block_notice(job).reason == "Retry-After 5.0 s from a 429 on call 17"


def test_the_banner_names_the_block_that_holds_the_api_not_a_shorter_one_since(make_job):
    job = running(make_job(calls=20))
    api_block(api=job.api, seconds=30)
    # a 429 during the operator's block pauses the API for a second, ending long before it
    ThrottleEvent.objects.create(
        api=job.api, job=job, call=job.calls.get(index=5), kind="throttled", status_code=429,
        retry_after=1.0,
    )  # fmt: skip
    assert job_block_notice(job).reason == "manual block by an operator"
