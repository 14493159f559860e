"""A claim that fails part way gives its calls back at once: taken by the claiming UPDATE but
never started, they would otherwise stay RUNNING under a live process until their claim ran out,
minutes later (found by `make chaos`: 5 calls of a job stuck RUNNING after a PostgreSQL restart).
"""

from __future__ import annotations

import time

import pytest
from django.db import OperationalError
from django.utils import timezone

from ratejobs.models import Api, Call, Job
from ratejobs.services import calls
from ratejobs.worker import engine, reconcile

pytestmark = pytest.mark.django_db(transaction=True)


def test_calls_a_failed_claim_took_go_back_to_the_dispatcher(
    monkeypatch, user, unique_name, redis_down
):
    # given dispatched calls, and a claim whose UPDATE commits but whose answer never comes back
    # (PostgreSQL stopped right after it)
    api = Api.objects.create(name=unique_name, base_url="https://api.example.com", rate=10)
    job = Job.objects.create(owner=user, api=api, name="j", status=Job.Status.RUNNING, total=3)
    Call.objects.bulk_create(
        Call(job=job, index=i, method="GET", path=f"/{i}", dispatched_at=timezone.now())
        for i in range(3)
    )
    ids = sorted(job.calls.values_list("pk", flat=True))

    def claim_then_lose_the_answer(**kwargs):
        assert calls.calls_claim(**kwargs)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(engine, "calls_claim", claim_then_lose_the_answer)
    dispatched = []
    monkeypatch.setattr(reconcile, "request_dispatch", dispatched.append)
    process = engine.Engine(in_flight=4, heartbeat_seconds=0.2, sweep_seconds=1)
    try:
        with pytest.raises(OperationalError):
            process.start(job_id=job.pk, call_ids=ids)
        # expect: the engine's recorder gives them back to the dispatcher within moments
        deadline = time.monotonic() + 10
        running = Call.objects.filter(job=job, status=Call.Status.RUNNING)
        while running.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(job.calls.values_list("status", "dispatched_at", "claim_token")) == {
            (Call.Status.PENDING, None, "")
        }
        assert dispatched == [api.pk]
    finally:
        process.stop(timeout=5)
