"""Every key the limiter writes expires, no sooner than what it must remember (its longest
window, its leases, a block, an adaptive cut) and not forever: an idle bucket leaves Redis and
comes back full from the limits, the refund history is bounded in time, and a deleted
credential leaves no key. Real Redis; short windows keep the waits to a few seconds."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ratejobs.infra.connections import redis_client
from ratejobs.infra.limiters import api_limiter
from ratejobs.limiter import Limiter, LimiterConfig, Window
from ratejobs.limiter.core import MICROS
from ratejobs.models import Call
from ratejobs.namespace import limiter_key_prefix
from ratejobs.services.apis import api_update
from ratejobs.services.calls import calls_claim, calls_reserve_slots
from ratejobs.services.credentials import credential_delete, credentials_add
from ratejobs.services.jobs import job_create
from tests.limiter.conftest import worst_window_excess

HOUR = 3600.0
# Wake-up tokens for callers waiting for a lease (lib/leases.lua's RELEASED_KEPT_MS): they matter
# for a second, so their list keeps a minute whatever the windows.
RELEASED_KEPT = 60.0
# lib/lifetimes.lua's LIFETIME_MARGIN_US and RENEW_SLACK_US: past what a bucket must remember, the
# expiry's margin and the slack that spares most calls a renewal (a quarter of a long window)
MARGIN = 1.0
SLACK = 1.0


def _keys(client: Any, limiter: Any) -> dict[str, float]:
    """The limiter's keys in Redis and their time to live in seconds (-1: none)."""
    found = {}
    for key in client.scan_iter(match=f"{limiter._base}:*"):
        pttl = client.pttl(key)
        found[key.decode().rsplit(":", 1)[1]] = pttl / 1000 if pttl >= 0 else pttl
    return found


def _wait_until_gone(client: Any, limiter: Any, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while _keys(client, limiter):
        assert time.monotonic() < deadline, f"still in Redis: {_keys(client, limiter)}"
        time.sleep(0.05)
    return time.monotonic()


def test_every_key_a_limiter_writes_expires_no_sooner_than_its_longest_window(
    make_limiter, redis_client
):
    # given a rate, an hourly window, a cost window and an in-flight cap, used by every script
    config = LimiterConfig(
        rate=50.0, burst=5, max_concurrency=10,
        windows=(Window(1000.0, HOUR, 100), Window(500.0, 1.0, 500, "cost")),
    )  # fmt: skip
    limiter = make_limiter(config)
    grant = limiter.acquire(cost=20, lease_seconds=1)
    limiter.settle(grant, 5)
    batch = limiter.acquire_many(8, costs=[3] * 8, lease_seconds=1)
    for held in batch:
        limiter.settle(limiter.confirm(held), 1)
    limiter.observe_many([(g, 200, {}) for g in batch])
    limiter.release_many([grant, *batch])
    # expect: every key has an expiry; those remembering the quota keep the hour
    keys = _keys(redis_client, limiter)
    assert {"config", "state", "heads", "rates", "released"} <= set(keys)
    assert all(ttl > 0 for ttl in keys.values()), keys
    for part in ("config", "state", "heads", "rates"):
        assert keys[part] >= HOUR, (part, keys[part])
    assert keys["state"] <= HOUR * 1.25 + MARGIN + 0.01  # and not much longer
    assert 0 < keys["released"] <= RELEASED_KEPT


def test_a_lease_a_block_and_a_rate_cut_keep_the_bucket_until_they_end(make_limiter, redis_client):
    # given a one-second window: by itself the bucket would be forgotten a few seconds on;
    # CUBIC (no learning) climbs back to the rate before a cut in exactly recovery_seconds
    config = LimiterConfig(
        rate=10.0, burst=2, max_concurrency=5, adaptive=True, recovery_seconds=30.0, learn=False
    )
    limiter = make_limiter(config)
    held = limiter.acquire(lease_seconds=600)
    assert _keys(redis_client, limiter)["leases"] >= 600
    # a throttle cuts the adaptive rate (back at its ceiling 30 s on) and blocks 90 s
    limiter.report_throttle(held, block_seconds=90)
    keys = _keys(redis_client, limiter)
    assert keys["state"] >= 600 and keys["config"] >= 600  # never shortened below the lease
    limiter.release(held)
    # expect: a bucket whose lease and block are shorter keeps the block and the climb back
    other = make_limiter(config, name=limiter.name + "-b")
    other.report_throttle(other.acquire(lease_seconds=0.1), block_seconds=5)
    keys = _keys(redis_client, other)
    assert 30 - 0.1 <= keys["state"] <= 30 + MARGIN + SLACK, keys
    before = other.state().blocked_until_us
    other.block(120)
    assert _keys(redis_client, other)["state"] >= 119
    assert other.state().blocked_until_us > before


@pytest.mark.slow
def test_an_idle_bucket_vanishes_and_comes_back_full_without_handing_back_quota(
    redis_client, unique_name
):
    # given a bucket as a credential key's (no rate history) with 2 per 2 s (burst 2), spent
    window = Window(2.0, 2.0, 2)
    config = LimiterConfig(rate=100.0, burst=10, windows=(window,))
    limiter = Limiter(redis_client, unique_name, config, rate_samples_kept=0)
    slots = [limiter.acquire(lease_seconds=0.2).slot_us for _ in range(2)]
    spent = time.monotonic()
    keys = _keys(redis_client, limiter)
    assert all(
        window.period <= ttl <= window.period + MARGIN + SLACK + 0.3 for ttl in keys.values()
    ), keys
    # expect: nothing left of it once the window has passed, and not before
    gone = _wait_until_gone(redis_client, limiter, timeout=10)
    assert gone - spent >= window.period
    # and its next use configures it again from the limits: full, as the window is by then
    again = [limiter.acquire(max_wait=0) for _ in range(2)]
    state = limiter.state()
    assert state.configured and [w.window for w in state.windows] == [window]
    slots += [g.slot_us for g in again]
    assert worst_window_excess(slots, [1] * 4, rate=2.0, period=2.0, burst=2) <= 0
    assert all(ttl > 0 for ttl in _keys(redis_client, limiter).values())
    limiter.delete()


@pytest.mark.slow
def test_the_refund_history_keeps_no_more_than_its_windows_time(make_limiter, redis_client):
    # given a cost window of one second and a burst of 40 reservations recorded for refunds
    limiter = make_limiter(LimiterConfig(rate=1000.0, burst=100,
                                         windows=(Window(100.0, 1.0, 100, "cost"),)))  # fmt: skip
    burst = [limiter.acquire(cost=1, lease_seconds=0.2) for _ in range(40)]
    limiter.release_many(burst)
    heads = f"{limiter._base}:heads"
    assert redis_client.zcard(heads) == 40
    # when the bucket stays in use, one grant every 0.3 s, for two of its lifetimes (2-3 s each)
    deadline = time.monotonic() + 6.5
    while time.monotonic() < deadline:
        limiter.release(limiter.acquire(cost=1, lease_seconds=0.2))
        time.sleep(0.3)
    # expect: the burst's entries are gone; only the last lifetimes' reservations remain
    oldest = redis_client.zrange(heads, 0, 0, withscores=True)
    assert oldest and oldest[0][1] > burst[-1].cost_seq
    assert redis_client.zcard(heads) < 40
    # and a refund for a grant from the burst gives nothing back now
    before = limiter.state().windows[0].remaining
    limiter.settle(burst[0], 0)
    assert limiter.state().windows[0].remaining <= before + 0.01


@pytest.mark.django_db
@pytest.mark.usefixtures("services_redis")
def test_deleting_a_credential_deletes_its_bucket(make_api, django_capture_on_commit_callbacks):
    api = make_api(rate=10, burst=2, limits=[{"rate": 100, "period": 60, "burst": 100,
                                              "unit": "cost"}])  # fmt: skip
    credentials_add(api=api, items=[("gone", "x"), ("kept", "y")])
    for key in ("gone", "kept"):
        limiter = api_limiter(api, key)
        limiter.settle(limiter.acquire(cost=10), 4)
    client = redis_client()
    pattern = f"{limiter_key_prefix()}:{{{api.name}:gone}}:*"
    assert list(client.scan_iter(match=pattern))
    with django_capture_on_commit_callbacks(execute=True):
        assert credential_delete(api=api, key="gone")
    assert list(client.scan_iter(match=pattern)) == []
    assert api_limiter(api, "kept").state().configured  # the other customer's is untouched


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.usefixtures("services_redis")
def test_an_expired_key_bucket_is_configured_again_from_the_databases_limits(
    make_api, user, django_capture_on_commit_callbacks
):
    # given a key's bucket used once with a 2 s window, then idle until it expired
    api = make_api(rate=50, burst=5, limits=[{"rate": 2, "period": 2, "burst": 2}])
    credentials_add(api=api, items=[("idle", "x")])
    limiter = api_limiter(api, "idle")
    limiter.release(limiter.acquire(lease_seconds=0.2))
    _wait_until_gone(redis_client(), limiter, timeout=10)
    # when the database's limits change meanwhile, and a worker claims a call of that key
    with django_capture_on_commit_callbacks(execute=True):
        api = api_update(api=api, limits=[{"rate": 3, "period": 2, "burst": 3}])
    job = job_create(owner=user, api=api, name="j", calls=[{"path": "/"}], credential_key="idle")
    Call.objects.filter(job=job).update(dispatched_at=job.created)
    claims = calls_claim(job_id=job.pk, call_ids=job.calls.values_list("pk", flat=True),
                         owner="test-owner")  # fmt: skip
    (reserved,) = calls_reserve_slots(claims)
    # expect: the bucket is back with the database's limits, and the call has its slot
    assert reserved.reserved is not None
    state = api_limiter(api, "idle").state()
    assert state.configured and state.config_version == api.limits_version
    assert [w.window for w in state.windows] == [Window(3.0, 2.0, 3)]
    assert state.counts.grants == 1 and state.counts.waits == 0
    assert reserved.reserved.slot_us <= state.now_us + 1 * MICROS


def test_a_limits_change_leaves_the_refund_history_expiring(make_limiter, redis_client):
    # given a bucket with a cost window and one grant that cost something (a refund entry)
    cost_window = Window(rate=100.0, period=1.0, burst=10, unit="cost")
    config = LimiterConfig(rate=5.0, burst=1, windows=(cost_window,), version=1)
    limiter = make_limiter(config)
    limiter.acquire(max_wait=0, cost=1)
    assert redis_client.pttl(limiter.heads_key) > 0
    # when a window is added
    requests_window = Window(rate=2.0, period=1.0, burst=1)
    limiter.configure(
        LimiterConfig(rate=5.0, burst=1, windows=(requests_window, cost_window), version=2)
    )
    # expect: the history still expires (T1: every key a script writes has an expiry)
    assert redis_client.pttl(limiter.heads_key) != -1
