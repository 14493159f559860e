"""Large calls keep their place end to end (limiter rule P5): through a real worker against a
sandbox that counts tokens, a call whose cost is near the cost window's burst is sent soon after
it is first tried however many small calls compete for the window, and one that can never fit
fails with that reason."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from ratejobs.models import Call
from ratejobs.services.apis import api_create, api_update
from ratejobs.services.jobs import job_create
from tests.realparts import wait_for_job
from tests.sandbox.conftest import worst_window_excess

# The cost window: 100 units a second, a burst of 200; small calls cost 5 and the large
# ones 190, whose units take 1.9 s to refill, more than the worker's one-second wait.
RATE, BURST, SMALL, LARGE = 100, 200, 5, 190
# Small calls enough to keep the window busy for about 8 s, the large ones spread among them.
SMALLS, LARGE_EVERY = 160, 50
# Arrivals reach the sandbox a few milliseconds from their slots: its window takes one small
# call more, and a stretch of its log may hold that much over the limiter's bound.
JITTER_TOKENS = SMALL


def _owner():
    return get_user_model().objects.create_user("keep-place-owner", password="x")


@pytest.mark.django_db(transaction=True)
def test_near_burst_calls_among_many_small_ones_are_each_sent_within_twice_their_time(
    sandbox, shared_worker, unique_name
):
    # given a sandbox charging each request the tokens it names against 100 a second (burst
    # 200), and a job of 160 calls of cost 5 with a cost-190 call after every 50 of them
    server = sandbox(
        rate=1000, burst=100, headers="none",
        token_rate=RATE, token_period=1, token_burst=BURST + JITTER_TOKENS,
    )  # fmt: skip
    api = api_create(
        name=unique_name, base_url=server.url, rate=100, burst=10,
        limits=[{"rate": RATE, "period": 1, "burst": BURST, "unit": "cost"}],
    )  # fmt: skip
    calls = []
    for i in range(SMALLS):
        if i and i % LARGE_EVERY == 0:
            calls.append({"path": f"/large/{i}", "query": {"tokens": LARGE}, "cost": LARGE})
        calls.append({"path": f"/small/{i}", "query": {"tokens": SMALL}, "cost": SMALL})
    job = job_create(owner=_owner(), api=api, name="mixed costs", calls=calls)
    # when the worker runs it
    job = wait_for_job(job, timeout=90, poll=0.2, worker=shared_worker)
    stats = server.stats(detail=True)
    # expect: every call sent once and none refused by the sandbox's token budget
    assert (job.succeeded, job.failed, job.throttled) == (len(calls), 0, 0)
    assert stats["throttled"] == 0 and stats["arrivals"] == len(calls)
    # and each large call reached the API within twice the 1.9 s its cost needs at the
    # window's rate after it became ready: first tried, and the large call before it sent
    # (the two cannot share the window's refill). At most a second of small calls is promised
    # ahead of it (the worker's wait), then comes its own refill; 2x leaves the rest for the
    # way back through the database to its kept place.
    arrived = {entry["path"]: entry["t"] for entry in stats["log"]}
    large = Call.objects.filter(job=job, path__startswith="/large/").order_by("index")
    took, before = {}, 0.0
    for call in sorted(large, key=lambda c: arrived[c.path]):
        ready = max(call.started.timestamp(), before)
        took[call.path] = round(arrived[call.path] - ready, 2)
        before = arrived[call.path]
    print(f"large calls sent this long after they became ready: {took}")
    assert len(took) == sum(c["cost"] == LARGE for c in calls)
    assert max(took.values()) <= 2 * LARGE / RATE, took
    # and no stretch of the arrivals took more tokens than the window allows
    times, tokens = zip(*[(e["t"], e["tokens"]) for e in stats["log"]], strict=True)
    excess = worst_window_excess(times, rate=RATE, period=1, burst=BURST, weights=tokens)
    assert excess <= JITTER_TOKENS


@pytest.mark.django_db(transaction=True)
def test_a_call_that_can_never_fit_fails_with_that_reason(sandbox, shared_worker, unique_name):
    # given a job whose call costs 190 against a burst of 200, held back a few seconds, and the
    # API's cost window then cut to a burst of 100
    server = sandbox(rate=1000, burst=100, headers="none")
    api = api_create(
        name=unique_name, base_url=server.url, rate=100, burst=10,
        limits=[{"rate": RATE, "period": 1, "burst": BURST, "unit": "cost"}],
    )  # fmt: skip
    job = job_create(
        owner=_owner(), api=api, name="too big",
        not_before=timezone.now() + timedelta(seconds=2),
        calls=[{"path": "/big", "cost": LARGE}, {"path": "/fits", "cost": SMALL}],
    )  # fmt: skip
    api_update(api=api, limits=[{"rate": RATE, "period": 1, "burst": 100, "unit": "cost"}])
    # when the worker runs it
    job = wait_for_job(job, timeout=60, poll=0.2, worker=shared_worker)
    # expect: the big call failed once, with the reason, and was never sent; the other went
    big = Call.objects.get(job=job, path="/big")
    assert big.status == "failed"
    assert big.error.startswith("can never be sent, whatever the wait: "), big.error
    assert "cost 190 exceeds" in big.error and "burst 100" in big.error
    assert (job.succeeded, job.failed) == (1, 1)
    assert [entry["path"] for entry in server.stats(detail=True)["log"]] == ["/fits"]
