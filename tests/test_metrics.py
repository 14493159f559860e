"""Prometheus metrics at /metrics: the shared limiter's counts and state per API, calls and jobs
by status, bounded labels, an optional bearer token."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Call, Job
from ratejobs.services.apis import api_block

pytestmark = pytest.mark.usefixtures("services_redis")


@pytest.fixture(autouse=True)
def _metrics_open_to_the_test_client(settings):
    """Most tests read the metrics, not the access rule: opened as the demo opens them."""
    settings.RATEJOBS_METRICS_PUBLIC = True


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_metrics_show_the_limiter_counts_and_state_of_each_api(client, api):
    limiter = api_limiter(api)
    for _ in range(3):
        with limiter.slot(max_wait=1.0):
            pass
    api_block(api=api, seconds=30)
    samples = scrape(client)
    label = (("api", api.name),)
    assert samples[("ratejobs_limiter_up", label)] == 1
    assert samples[("ratejobs_limiter_grants_total", label)] == 3
    assert samples[("ratejobs_limiter_blocks_total", label)] == 1
    assert samples[("ratejobs_limiter_rate", label)] == pytest.approx(10.0)
    assert samples[("ratejobs_limiter_rate_ceiling", label)] == pytest.approx(10.0)
    assert 25 < samples[("ratejobs_limiter_blocked_seconds", label)] <= 30
    assert samples[("ratejobs_limiter_in_flight", label)] == 0
    assert samples[("ratejobs_limiter_waits_total", (("api", api.name), ("reason", "slot")))] == 2


def test_metrics_count_calls_and_jobs_by_status(client, api, make_job):
    job = make_job(calls=5)
    make_job(calls=2)
    calls = list(job.calls.order_by("index"))
    Call.objects.filter(pk=calls[0].pk).update(status=Call.Status.SUCCEEDED)
    Call.objects.filter(pk=calls[1].pk).update(status=Call.Status.FAILED)
    Call.objects.filter(pk=calls[2].pk).update(
        status=Call.Status.RUNNING, dispatched_at=calls[2].created
    )
    Job.objects.filter(pk=job.pk).update(succeeded=1, failed=1, status=Job.Status.RUNNING)
    samples = scrape(client)

    def calls_in(status: str) -> float:
        return samples[("ratejobs_calls", (("api", api.name), ("status", status)))]

    assert [calls_in(s) for s in ("pending", "running", "succeeded", "failed", "cancelled")] == [
        4, 1, 1, 1, 0,
    ]  # fmt: skip
    assert samples[("ratejobs_jobs", (("status", "running"),))] == 1
    assert samples[("ratejobs_jobs", (("status", "queued"),))] == 1
    assert samples[("ratejobs_jobs", (("status", "completed"),))] == 0


def test_labels_stay_bounded_and_queries_do_not_grow_with_jobs(client, api, make_job):
    make_job(calls=2)
    with CaptureQueriesContext(connection) as few_jobs:
        scrape(client)
    for _ in range(20):
        make_job(calls=2)
    with CaptureQueriesContext(connection) as many_jobs:
        samples = scrape(client)
    assert len(many_jobs) == len(few_jobs) <= 4
    label_names = {name for _, labels in samples for name, _ in labels}
    assert label_names <= {"api", "status", "reason", "generation", "implementation",
                           "major", "minor", "patchlevel", "version"}  # fmt: skip


def test_metrics_stay_up_when_redis_is_down(client, api, redis_down):
    samples = scrape(client)
    assert samples[("ratejobs_limiter_up", (("api", api.name),))] == 0
    assert ("ratejobs_limiter_grants_total", (("api", api.name),)) not in samples


def test_metrics_are_closed_without_a_token_unless_said_public(client, api, settings):
    settings.RATEJOBS_METRICS_PUBLIC = False
    closed = client.get("/metrics")
    assert closed.status_code == 403 and b"RATEJOBS_METRICS_TOKEN" in closed.content


def test_a_metrics_token_keeps_other_scrapers_out(client, api, settings):
    settings.RATEJOBS_METRICS_TOKEN = "scrape-token"
    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert scrape(client, Authorization="Bearer scrape-token")


def test_the_health_check_answers_while_the_database_does(client, services_redis):
    # every part of /healthz is tested in tests/test_health.py
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["checks"]["database"]["status"] == "ok"
