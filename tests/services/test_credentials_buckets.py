"""Each credential key has its own limiter bucket, made on first use from the API's limits; the
per-process caches stay bounded; a claim's slots are reserved per bucket. Real Redis."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from ratejobs.infra import limiters
from ratejobs.infra.connections import redis_client
from ratejobs.infra.limiters import api_limiter
from ratejobs.limiter import WaitTooLong
from ratejobs.limiter.buckets import key_buckets
from ratejobs.models import Call
from ratejobs.namespace import limiter_key_prefix
from ratejobs.services import credentials as credential_services
from ratejobs.services.apis import api_limiter_reset
from ratejobs.services.calls import (
    Finished,
    call_attempt_by_id,
    calls_claim,
    calls_record_outcomes,
    calls_reserve_slots,
    calls_slot_too_far,
)
from ratejobs.services.credentials import credentials_add, key_secrets
from ratejobs.services.jobs import job_create
from ratejobs.worker.dispatch import _credential_buckets_running, dispatch_window

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("services_redis")]


def test_a_block_on_one_key_stops_only_that_keys_bucket(make_api):
    # given an API at 10/s, burst 1: the API's own bucket and two keys' buckets
    api = make_api(rate=10, burst=1)
    api_limiter(api, "acme").block(30)  # a 429 with Retry-After: 30 for acme's credential
    # expect: acme waits; globex and the API's own credential go at once
    with pytest.raises(WaitTooLong):
        api_limiter(api, "acme").acquire(max_wait=0.1)
    assert api_limiter(api, "globex").acquire(max_wait=0.1).waited < 0.1
    assert api_limiter(api).acquire(max_wait=0.1).waited < 0.1
    buckets = key_buckets(redis_client(), api.name, key_prefix=limiter_key_prefix())
    assert (buckets.live, [b.key for b in buckets.top]) == (2, ["acme"])
    assert buckets.top[0].blocked_for > 25
    # and a reset of the API resets every key's bucket
    assert api_limiter_reset(api=api) == 2
    assert api_limiter(api, "acme").acquire(max_wait=0.1).waited < 0.1


def test_a_key_bucket_is_configured_on_first_use_with_the_apis_limits(make_api):
    api = make_api(rate=5, period=1, burst=2)
    limiter = api_limiter(api, "new-customer")
    assert not limiter.state().configured  # nothing in Redis before its first grant
    limiter.acquire(max_wait=1)
    state = limiter.state()
    assert (state.configured, state.rate, state.burst, state.config_version) == (
        True, 5, 2, api.limits_version,
    )  # fmt: skip
    assert limiter.name == f"{api.name}:new-customer"


def test_the_per_process_caches_of_limiters_and_secrets_stay_bounded(make_api, monkeypatch):
    monkeypatch.setattr(limiters, "MAX_CACHED_LIMITERS", 5)
    monkeypatch.setattr(credential_services, "MAX_CACHED_SECRETS", 5)
    api = make_api()
    credentials_add(api=api, items=[(f"k{i}", f"secret-{i}") for i in range(20)])
    for i in range(20):
        api_limiter(api, f"k{i}")
    found = key_secrets(api=api, keys=[f"k{i}" for i in range(20)])
    assert found["k7"].secret == "secret-7"
    assert len(limiters._limiters) == 5
    assert len(credential_services._secrets) <= 5
    assert "k19" in str(list(limiters._limiters))  # the most recent stay


def test_a_claim_over_three_keys_reserves_each_keys_slots_in_its_own_bucket(make_api, user: Any):
    # given an API at 2/s burst 1 and a claim of 6 calls over 3 keys
    api = make_api(rate=2, burst=1)
    credentials_add(api=api, items=[("a", "x"), ("b", "y"), ("c", "z")])
    calls = [{"path": f"/{i}", "credential_key": "abc"[i % 3]} for i in range(6)]
    job = job_create(owner=user, api=api, name="keys", calls=calls)
    Call.objects.filter(job=job).update(dispatched_at=job.created)
    claims = calls_claim(job_id=job.pk, call_ids=job.calls.values_list("pk", flat=True),
                         owner="test-owner")  # fmt: skip
    reserved = calls_reserve_slots(claims)
    # expect: every call has a slot (two per bucket at 2/s fit in a second), each from its
    # key's bucket; one bucket alone could not give six within the worker's wait
    assert all(item.reserved is not None for item in reserved)
    by_key = {}
    for item in reserved:
        by_key.setdefault(item.call.credential_key, []).append(item)
        assert item.context.limiter.name == f"{api.name}:{item.call.credential_key}"
    assert sorted(len(items) for items in by_key.values()) == [2, 2, 2]
    for key in "abc":  # one slot now, one reserved half a second on (counted as a wait)
        counts = api_limiter(api, key).state().counts
        assert (counts.grants, counts.waits) == (1, 1)
    assert api_limiter(api).state().counts.grants == 0
    # and the secret each call is sent with is its key's
    assert {item.context.secret for item in by_key["b"]} == {"y"}


def test_a_deleted_key_makes_its_calls_fail_rather_than_go_without(make_api, user):
    api = make_api()
    credentials_add(api=api, items=[("gone", "x")])
    job = job_create(owner=user, api=api, name="j", calls=[{"path": "/"}], credential_key="gone")
    credential_services.credential_delete(api=api, key="gone")
    Call.objects.filter(job=job).update(dispatched_at=job.created)
    (claim,) = calls_claim(job_id=job.pk, call_ids=job.calls.values_list("pk", flat=True),
                           owner="test-owner")  # fmt: skip
    assert claim.context.secret is None and "no credential" in claim.context.credential_error


def test_a_429_for_one_customers_key_blocks_only_that_keys_bucket(
    make_api, user, http_server, marker, caplog
):
    # given calls of two keys, acme's answered 429 with Retry-After: 30 by the API
    api = make_api(base_url=http_server.base, rate=10, burst=1)
    credentials_add(api=api, items=[("acme", "a"), ("globex", "g")])
    calls = [
        {"path": f"/status/429/{marker}", "query": {"retry_after": "30"}, "credential_key": "acme"},
        {"path": f"/ok/{marker}", "credential_key": "globex"},
    ]
    job = job_create(owner=user, api=api, name="j", calls=calls)
    Call.objects.filter(job=job).update(dispatched_at=timezone.now())
    throttled, ok = job.calls.order_by("index")
    # expect: acme's bucket is blocked for the Retry-After; globex's call still goes at once
    with caplog.at_level("INFO", logger="ratejobs.services.calls"):
        assert call_attempt_by_id(call_id=throttled.pk) == "throttled"
    (line,) = [r for r in caplog.records if r.getMessage().startswith("throttle decision")]
    assert f"api={api.name} key=acme job=" in line.getMessage()
    assert line.credential_key == "acme"
    assert api_limiter(api, "acme").state().blocked_for > 25
    assert call_attempt_by_id(call_id=ok.pk) == "succeeded"
    assert api_limiter(api, "globex").state().blocked_for == 0
    assert api_limiter(api).state().blocked_for == 0
    assert [s.headers["Authorization"] for s in http_server.requests_with(marker)] == ["a", "g"]


def test_the_dispatch_window_grows_with_the_keys_its_running_calls_use(make_api, user):
    # given calls running over the job's key and two calls' own keys
    api = make_api(rate=100)
    assert _credential_buckets_running(api.pk, has_credentials=False) == 1  # no query of calls
    credentials_add(api=api, items=[("a", "x"), ("b", "y"), ("c", "z")])
    calls = [{"path": "/1"}, {"path": "/2", "credential_key": "b"}, {"path": "/3"},
             {"path": "/4", "credential_key": "c"}]  # fmt: skip
    job = job_create(owner=user, api=api, name="j", calls=calls, credential_key="a")
    assert _credential_buckets_running(api.pk, has_credentials=True) == 1  # nothing running yet
    Call.objects.filter(job=job).update(status=Call.Status.RUNNING)
    # expect: three buckets (a, b, c), so three times the API's window
    assert _credential_buckets_running(api.pk, has_credentials=True) == 3
    assert dispatch_window(api, buckets=3) == 3 * dispatch_window(api)


def test_calls_whose_slot_is_beyond_the_wait_go_back_unattempted(make_api, user: Any):
    # given an API at 5/s, burst 1, and a claim of 12 calls: the worker's wait (1 s) holds the
    # slots at 0, 0.2, ..., 1.0 s
    api = make_api(rate=5, burst=1)
    job = job_create(owner=user, api=api, name="far", calls=[{"path": f"/{i}"} for i in range(12)])
    Call.objects.filter(job=job).update(dispatched_at=job.created)
    claims = calls_claim(job_id=job.pk, call_ids=job.calls.values_list("pk", flat=True),
                         owner="test-owner")  # fmt: skip
    reserved = calls_reserve_slots(claims)
    # expect: five or six reserved (the slot at 1.0 s is on the edge); the others know how
    # far the next slot is, and their outcome is the attempt's own "wait" for it, without an
    # attempt used
    far = [item for item in reserved if item.reserved is None]
    assert len(far) in (6, 7)
    assert all(0.9 < item.slot_in <= 1.25 for item in far)
    outcome = calls_slot_too_far(far[0])
    assert (outcome.kind, outcome.attempts, outcome.sent) == ("wait", 0, False)
    assert outcome.retry_after == far[0].slot_in
    assert "beyond max_wait" in outcome.error
    calls_record_outcomes([Finished(item, calls_slot_too_far(item)) for item in far])
    back = Call.objects.filter(pk__in=[item.call.pk for item in far])
    assert {(c.status, c.attempts) for c in back} == {("pending", 0)}
    assert all(c.next_attempt_at > timezone.now() for c in back)
