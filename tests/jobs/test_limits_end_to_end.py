"""Several limits and call cost end to end: the sandbox enforcing a per-second rate and a longer
window, or a token budget, and jobs run through the real limiter (and real workers) against it.

The sandbox sends no quota headers here (headers="none"), so nothing but the limiter's own
windows keeps the jobs inside its limits."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Call
from ratejobs.services.apis import api_create
from ratejobs.services.calls import (
    Finished,
    call_attempt,
    calls_claim,
    calls_record_outcomes,
    calls_reserve_slots,
)
from ratejobs.services.jobs import job_create
from sandbox import Sandbox
from tests.realparts import wait_for_job
from tests.sandbox.conftest import worst_window_excess

# An arrival reaches the sandbox a few milliseconds after its grant, and not always the same
# few: two arrivals can come closer together than their grants did. The sandbox's window gets
# this many more units of burst than the limiter's so that jitter is no 429, and a window of
# its log may hold this many more than the limiter's bound.
JITTER_UNITS = 2


def _owner():
    return get_user_model().objects.create_user("limits-owner", password="x")


def _tokens(index: int) -> tuple[int, int]:
    """Call `index`'s actual tokens (what the sandbox charges) and its estimate: 30% over on
    even calls, 30% under on odd ones, so the corrections go both ways."""
    actual = 20 + (index * 37) % 81  # 20 to 100
    return actual, round(actual * (1.3 if index % 2 == 0 else 0.7))


@pytest.mark.django_db
def test_a_claimed_batch_reserves_each_call_s_cost_and_records_what_it_used(
    services_redis, unique_name
):
    # given an API with a token window and calls estimated over and under what they use
    server = Sandbox(rate=1000, burst=100, headers="none").start()
    try:
        api = api_create(
            name=unique_name, base_url=server.url, rate=1000, burst=100,
            limits=[{"rate": 100_000, "period": 3600, "burst": 10_000, "unit": "cost"}],
            cost_header="X-Tokens-Used",
        )  # fmt: skip
        calls = [
            {"path": f"/items/{i}", "query": {"tokens": _tokens(i)[0]}, "cost": _tokens(i)[1]}
            for i in range(6)
        ]
        job = job_create(owner=_owner(), api=api, name="batch", calls=calls)
        Call.objects.filter(job=job).update(dispatched_at=timezone.now())
        # when a worker claims them, reserves their slots in one round trip and runs them
        ids = Call.objects.filter(job=job).values_list("pk", flat=True)
        claims = calls_reserve_slots(calls_claim(job_id=job.pk, call_ids=ids, owner="test"))
        assert [c.reserved.cost for c in claims] == [_tokens(i)[1] for i in range(6)]
        calls_record_outcomes([Finished(c, call_attempt(c)) for c in claims])
    finally:
        server.stop()
    # expect: each call records what it used, and the window holds what they used in all
    used = list(Call.objects.filter(job=job).order_by("index").values_list("cost_used", flat=True))
    assert used == [_tokens(i)[0] for i in range(6)]
    (window,) = api_limiter(api).state().windows
    taken = 10_000 - window.remaining
    assert sum(used) - 10 <= taken <= sum(used)  # refilling at about 28 a second meanwhile


@pytest.mark.django_db(transaction=True)
def test_a_job_under_a_rate_and_a_longer_window_runs_at_the_lower_with_no_429s(
    sandbox, shared_worker, unique_name
):
    # given the 20/s and 300/min with the minute 20 times shorter: 20/s and 15 per 3 s
    # (burst 15) still allow 5 a second, a quarter of the rate, once the window's burst is
    # spent, and the job runs in seconds; the sandbox enforces both (its window with
    # JITTER_UNITS more burst)
    server = sandbox(rate=20, burst=5, windows=[(15, 3, 15 + JITTER_UNITS)], headers="none")
    api = api_create(
        name=unique_name, base_url=server.url, rate=20, burst=1,
        limits=[{"rate": 15, "period": 3, "burst": 15}],
    )  # fmt: skip
    calls = 30
    job = job_create(
        owner=_owner(), api=api, name="two limits",
        calls=[{"path": f"/items/{i}"} for i in range(calls)],
    )  # fmt: skip
    job = wait_for_job(job, timeout=60, poll=0.2)
    stats = server.stats(detail=True)
    times = [entry["t"] for entry in stats["log"]]
    elapsed = (job.finished - job.started).total_seconds()
    print(f"{calls} calls in {elapsed:.1f}s; sandbox: {stats['throttled_by']}, windows "
          f"{stats['windows']}")  # fmt: skip
    # expect: every call succeeds with no 429 from either limit of the sandbox
    assert (job.succeeded, job.throttled) == (calls, 0)
    assert stats["throttled"] == 0 and stats["arrivals"] == calls
    # and no stretch of the arrivals holds more than either limit allows (each window's burst
    # plus its rate over the stretch), give or take the network's jitter
    assert worst_window_excess(times, rate=20, period=1, burst=1) <= JITTER_UNITS
    assert worst_window_excess(times, rate=15, period=3, burst=15) <= JITTER_UNITS
    # so the job ran at the lower of the two once the window's burst was spent: the 15 calls
    # after the first 15, at 5 a second, cannot take less than 3 seconds
    assert times[-1] - times[0] >= (calls - 15) / 5 - 0.1


@pytest.mark.django_db(transaction=True)
def test_a_tokens_per_second_budget_holds_with_estimates_over_and_under_the_tokens_used(
    sandbox, shared_worker, unique_name
):
    # given a sandbox with a budget of 600 tokens a second (burst 600; a tokens-per-minute
    # budget 60 times faster, so the job takes seconds) charging each request the tokens it
    # names, and calls whose estimates are 30% over or under those tokens
    budget_rate, budget_burst = 600, 600
    server = sandbox(
        rate=200, burst=20, headers="none",
        token_rate=budget_rate, token_period=1, token_burst=budget_burst,
    )  # fmt: skip
    # An under-estimate is charged in full only once its response is read; until then the
    # sandbox has counted more than the limiter. With at most `in_flight` calls granted and
    # not yet settled, each at most `most_under` tokens under, the limiter's window is that
    # much smaller than the sandbox's budget (and a little more for the network's jitter), so
    # no call is refused.
    # (An in-flight cap also keeps few calls in the broker: the job finishes only if the calls
    # that end while the first dispatch runs ask for the next one, which they once did not.)
    in_flight, most_under = 4, 30
    margin = in_flight * most_under + 30
    api = api_create(
        name=unique_name, base_url=server.url, rate=100, burst=5, max_concurrency=in_flight,
        limits=[{"rate": budget_rate, "period": 1, "burst": budget_burst - margin,
                 "unit": "cost"}],
        cost_json_field="usage.total_tokens",
    )  # fmt: skip
    calls = [
        {"path": f"/items/{i}", "query": {"tokens": _tokens(i)[0]}, "cost": _tokens(i)[1]}
        for i in range(30)
    ]
    job = job_create(owner=_owner(), api=api, name="tokens", calls=calls)
    job = wait_for_job(job, timeout=60, poll=0.2)
    stats = server.stats(detail=True)
    tokens = stats["tokens"]
    print(f"sandbox tokens: {tokens}; throttled by {stats['throttled_by']}")
    # expect: every call succeeds, the token budget refused none, and every call recorded the
    # tokens it used (from the JSON body), not its estimate
    assert (job.succeeded, job.throttled) == (30, 0)
    assert stats["throttled_by"]["tokens"] == 0 and stats["throttled"] == 0
    used = list(Call.objects.filter(job=job).order_by("index").values_list("cost_used", flat=True))
    assert used == [_tokens(i)[0] for i in range(30)]
    assert tokens["admitted"] == sum(used)
    # and no stretch of the arrivals took more tokens than the budget allows
    admitted = [entry for entry in stats["log"] if entry["status"] != 429]
    excess = worst_window_excess(
        [e["t"] for e in admitted], rate=budget_rate, period=1, burst=budget_burst,
        weights=[e["tokens"] for e in admitted],
    )  # fmt: skip
    assert excess <= 0


# The 30 a day made short: 6 per 6 s (burst 6, one a second once spent), behind a
# window far faster that never binds.
SPENT_WINDOW = {"rate": 6, "period": 6, "burst": 6}
FAST_WINDOW = {"rate": 1000, "period": 1, "burst": 1000}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "before, after",
    [([FAST_WINDOW, SPENT_WINDOW], [SPENT_WINDOW]), ([SPENT_WINDOW], [FAST_WINDOW, SPENT_WINDOW])],
    ids=["drop-the-fast-window", "add-one-in-front"],
)
def test_a_limits_change_through_rest_never_lets_a_request_past_a_spent_window(
    sandbox, shared_worker, client_for, manager, unique_name, before, after
):
    # given an API whose slow window a job has just spent, against a server that counts
    server = sandbox(rate=1000, burst=100, headers="none")
    api = api_create(
        name=unique_name, base_url=server.url, rate=100, burst=100, limits=before
    )  # fmt: skip
    spend = job_create(
        owner=manager, api=api, name="spend", calls=[{"path": f"/a/{i}"} for i in range(6)]
    )
    assert wait_for_job(spend, timeout=60).succeeded == 6
    # when a manager changes the other windows through the REST API, and a new job comes
    response = client_for(manager).patch(f"/api/apis/{api.name}/", {"limits": after}, format="json")
    assert response.status_code == 200, response.content
    api.refresh_from_db()
    late = job_create(
        owner=manager, api=api, name="late", calls=[{"path": f"/b/{i}"} for i in range(3)]
    )
    assert wait_for_job(late, timeout=60).succeeded == 3
    # expect: the server saw no request past the spent window: 6 per 6 s held across the change
    times = sorted(entry["t"] for entry in server.stats(detail=True)["log"])
    assert len(times) == 9
    assert worst_window_excess(times, **SPENT_WINDOW) < 1, times
