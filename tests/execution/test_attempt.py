"""attempt_call against a real HTTP server and the real shared limiter on Redis."""

from __future__ import annotations

import logging
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import requests

from ratejobs.execution import ExecutionPolicy, HttpRequest, attempt_call
from ratejobs.execution.attempt import LIMITER_UNAVAILABLE_RETRY_SECONDS
from ratejobs.execution.connections import new_session
from ratejobs.limiter import Limiter, LimiterConfig
from tests.realhttp import LOOPBACK, free_port

SECRET = "tok-s3cr3t-value"
POLICY = ExecutionPolicy(
    connect_timeout=1,
    read_timeout=1,
    total_timeout=3,
    max_attempts=3,
    max_throttled_retries=5,
    backoff_base=0.5,
    backoff_cap=4,
)


def run(request, limiter, session, *, attempts=1, throttled_retries=0, max_wait=1.0):
    return attempt_call(
        request,
        limiter=limiter,
        session=session,
        policy=POLICY,
        attempts=attempts,
        throttled_retries=throttled_retries,
        max_wait=max_wait,
        rng=random.Random(0),
    )


def get(url: str) -> HttpRequest:
    return HttpRequest("GET", url, {"Authorization": f"Bearer {SECRET}"})


def test_successful_call_takes_a_slot_and_returns_its_lease(
    http_server, session, make_limiter, marker
):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5, max_concurrency=2))
    outcome = run(get(http_server.url(f"/ok?m={marker}")), limiter, session)
    assert outcome.kind == "succeeded" and outcome.sent
    assert outcome.result.status_code == 200 and outcome.result.body == b"ok"
    assert outcome.slot_us is not None and outcome.generation is not None
    assert outcome.feedback is None and outcome.limiter_error == ""
    assert (outcome.attempts, outcome.throttled_retries) == (1, 0)
    assert limiter.state().in_flight == 0
    assert len(http_server.requests_with(marker)) == 1


def test_429_with_retry_after_blocks_every_worker_on_the_api(
    http_server, session, make_limiter, redis_url, unique_name
):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5, adaptive=True))
    outcome = run(get(http_server.url("/status/429?retry_after=2")), limiter, session)
    # expect: throttled, retried after the header, not counted against max_attempts
    assert outcome.kind == "throttled" and outcome.retry_after == 2.0
    assert (outcome.attempts, outcome.throttled_retries) == (0, 1)
    assert outcome.feedback is not None and outcome.feedback.accepted
    assert outcome.feedback.rate_decreased
    # and another worker's limiter on the same API (its own client) sees the block
    other_client = redis.Redis.from_url(redis_url)
    try:
        other = Limiter(other_client, unique_name)
        assert other.state().blocked_for > 1
    finally:
        other_client.close()


def test_burst_of_429s_cuts_the_rate_once(http_server, make_limiter):
    # given two calls in flight at once (same limiter generation), both answered 429
    limiter = make_limiter(LimiterConfig(rate=100, burst=5, adaptive=True))
    url = http_server.url("/status/429?retry_after=0&delay=0.3")
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run, get(url), limiter, new_session(LOOPBACK)) for _ in range(2)]
        outcomes = [f.result() for f in futures]
    # expect: both throttled, one throttle counted, the rate cut once (x0.7)
    assert [o.kind for o in outcomes] == ["throttled", "throttled"]
    assert sorted(o.feedback.accepted for o in outcomes) == [False, True]
    assert outcomes[0].generation == outcomes[1].generation
    assert limiter.state().current_rate == pytest.approx(70, rel=0.05)


def test_429_without_hints_blocks_for_the_unjittered_backoff(http_server, session, make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5))
    outcome = run(get(http_server.url("/status/429")), limiter, session, throttled_retries=1)
    # expect: everyone blocked for min(cap, base * 2**1) = 1 s; this call retries within it
    assert 0.7 < limiter.state().blocked_for <= 1.0
    assert outcome.kind == "throttled" and 0 <= outcome.retry_after <= 1.0
    assert outcome.throttled_retries == 2


def test_spent_quota_on_a_200_blocks_before_any_429(http_server, session, make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5))
    outcome = run(get(http_server.url("/status/200?remaining=0&reset=3")), limiter, session)
    assert outcome.kind == "succeeded"
    assert outcome.feedback is not None and limiter.state().blocked_for > 2


def test_slot_too_far_away_sends_nothing_and_says_when_to_come_back(
    http_server, session, make_limiter, marker
):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5))
    limiter.block(5)
    outcome = run(get(http_server.url(f"/ok?m={marker}")), limiter, session, max_wait=0.2)
    assert outcome.kind == "wait" and not outcome.sent
    assert 4 < outcome.retry_after <= 5
    assert outcome.result is None and outcome.slot_us is None
    assert (outcome.attempts, outcome.throttled_retries) == (0, 0)
    assert http_server.requests_with(marker) == []
    assert limiter.state().in_flight == 0


def test_slow_pace_gives_wait_with_the_slot_distance(http_server, session, make_limiter, marker):
    # given one request per minute, already used
    limiter = make_limiter(LimiterConfig(rate=1, period=60))
    assert run(get(http_server.url(f"/ok?m={marker}")), limiter, session).kind == "succeeded"
    outcome = run(get(http_server.url(f"/ok?m={marker}")), limiter, session, max_wait=0.5)
    assert outcome.kind == "wait" and 55 < outcome.retry_after <= 60
    assert len(http_server.requests_with(marker)) == 1


@pytest.mark.slow
def test_unreachable_limiter_sends_nothing(http_server, session, marker):
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5)
    limiter = Limiter(client, "unreachable", LimiterConfig(rate=10))
    outcome = run(get(http_server.url(f"/ok?m={marker}")), limiter, session)
    # expect: fail closed, retry soon, nothing reached the API
    assert outcome.kind == "wait" and not outcome.sent
    assert outcome.retry_after == LIMITER_UNAVAILABLE_RETRY_SECONDS
    assert "limiter unavailable" in outcome.error and "nothing sent" in outcome.error
    assert http_server.requests_with(marker) == []


class Interrupted(BaseException):
    """Stands in for a worker's time limit (Celery's SoftTimeLimitExceeded) during a send."""


def interrupted_session() -> requests.Session:
    session = new_session(LOOPBACK)

    def connection(*args, **kwargs):
        raise Interrupted

    session.get_adapter("http://").get_connection_with_tls_context = connection
    return session


def test_lease_is_returned_when_the_send_raises(make_limiter):
    # given a cap of one request in flight
    limiter = make_limiter(LimiterConfig(rate=100, burst=5, max_concurrency=1))
    with pytest.raises(Interrupted):
        run(get("http://127.0.0.1:9/x"), limiter, interrupted_session())
    # expect: the lease is back now, not at its expiry
    assert limiter.state().in_flight == 0
    limiter.release(limiter.acquire(max_wait=0))


def test_a_request_the_client_refuses_fails_at_once_and_returns_its_lease(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5, max_concurrency=1))
    outcome = run(get("http://:80/x"), limiter, new_session(LOOPBACK))
    assert outcome.kind == "failed" and "unexpected ValueError" in outcome.error
    assert outcome.attempts == 1 and not outcome.sent
    assert limiter.state().in_flight == 0


def test_server_errors_are_retried_until_max_attempts(http_server, session, make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5))
    url = http_server.url("/status/503")
    retry = run(get(url), limiter, session, attempts=2)
    assert retry.kind == "retry" and 0 <= retry.retry_after <= 1.0
    assert retry.attempts == 2
    failed = run(get(url), limiter, session, attempts=3)
    assert failed.kind == "failed" and "gave up after 3 attempts" in failed.error


def test_connection_refused_is_retried_and_returns_the_lease(session, make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5, max_concurrency=1))
    outcome = run(get(f"http://127.0.0.1:{free_port()}/x"), limiter, session)
    assert outcome.kind == "retry" and outcome.result.error_kind == "connect"
    assert outcome.feedback is None
    assert limiter.state().in_flight == 0


def test_timeout_is_retried(http_server, session, make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5))
    outcome = run(get(http_server.url("/slow?seconds=2")), limiter, session)
    assert outcome.kind == "retry" and outcome.result.error_kind == "timeout"


def test_not_found_fails_at_once(http_server, session, make_limiter):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5))
    outcome = run(get(http_server.url("/status/404")), limiter, session)
    assert outcome.kind == "failed" and outcome.error == "HTTP 404 Not Found"


def test_secrets_stay_out_of_reprs_errors_and_logs(http_server, session, make_limiter, caplog):
    limiter = make_limiter(LimiterConfig(rate=100, burst=5))
    caplog.set_level(logging.DEBUG, logger="ratejobs.execution")
    requests_ = [
        get(http_server.url(f"/ok?api_key={SECRET}")),
        get(f"http://127.0.0.1:{free_port()}/x?api_key={SECRET}"),
    ]
    for request in requests_:
        outcome = run(request, limiter, session)
        assert SECRET not in repr(request)
        assert SECRET not in repr(outcome)
        assert SECRET not in outcome.error and SECRET not in outcome.result.error
    assert caplog.records and SECRET not in caplog.text


@pytest.mark.parametrize(
    "kwargs",
    [
        {"connect_timeout": 0},
        {"max_attempts": 0},
        {"max_body_bytes": -1},
        {"backoff_cap": 0.1, "backoff_base": 1},
        {"max_throttled_retries": 1.5},
    ],
)
def test_nonsense_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        ExecutionPolicy(**kwargs)


def test_lease_outlives_the_longest_send():
    policy = ExecutionPolicy(connect_timeout=5, read_timeout=30, total_timeout=60)
    assert policy.lease_seconds > 60 + 5 + 30
