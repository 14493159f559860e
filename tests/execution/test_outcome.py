"""Classifying one attempt's result: succeed, fail, retry with backoff, or wait out a throttle."""

from __future__ import annotations

import random

import pytest

from ratejobs.execution import HttpResult, classify

LIMITS = {
    "max_attempts": 3,
    "max_throttled_retries": 2,
    "backoff_base": 1.0,
    "backoff_cap": 30.0,
}


def decide(result: HttpResult, *, attempts: int = 1, throttled_retries: int = 0):
    return classify(
        result,
        attempts=attempts,
        throttled_retries=throttled_retries,
        rng=random.Random(1),
        now=1_700_000_000.0,
        **LIMITS,
    )


def status(code: int, **headers: str) -> HttpResult:
    return HttpResult(status_code=code, headers=dict(headers))


CONNECT_ERROR = HttpResult(
    status_code=None, error_kind="connect", error="could not connect: Connection refused"
)
TIMEOUT = HttpResult(status_code=None, error_kind="timeout", error="no response within 1s")
REFUSED = HttpResult(
    status_code=None,
    error_kind="refused",
    error="address 127.0.0.2 of host a.test is not allowed by the outbound policy",
)


@pytest.mark.parametrize(
    ("result", "attempts", "throttled_retries", "kind"),
    [
        (status(200), 1, 0, "succeeded"),
        (status(204), 3, 0, "succeeded"),
        (status(301), 1, 0, "succeeded"),  # a redirect we would not follow is the answer
        (status(404), 1, 0, "failed"),
        (status(400), 1, 0, "failed"),
        (status(403), 1, 0, "failed"),
        (status(408), 1, 0, "retry"),
        (status(408), 3, 0, "failed"),
        (status(500), 1, 0, "retry"),
        (status(500), 2, 0, "retry"),
        (status(500), 3, 0, "failed"),
        (status(503), 1, 0, "retry"),
        (status(503), 3, 0, "failed"),
        (CONNECT_ERROR, 1, 0, "retry"),
        (CONNECT_ERROR, 3, 0, "failed"),
        (TIMEOUT, 2, 0, "retry"),
        (TIMEOUT, 3, 0, "failed"),
        # a refused address is configuration: no retry would get through
        (REFUSED, 1, 0, "failed"),
        (status(429), 1, 0, "throttled"),
        # throttles do not use up max_attempts...
        (status(429), 3, 0, "throttled"),
        (status(429, **{"Retry-After": "2"}), 3, 1, "throttled"),
        # ... but have their own limit
        (status(429), 1, 2, "failed"),
        (status(429, **{"Retry-After": "2"}), 1, 2, "failed"),
        # GitHub: a 403 with a throttle hint is a throttle
        (status(403, **{"Retry-After": "60"}), 1, 0, "throttled"),
        (
            status(403, **{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}),
            1,
            0,
            "throttled",
        ),
    ],
)
def test_classification_table(result, attempts, throttled_retries, kind):
    assert decide(result, attempts=attempts, throttled_retries=throttled_retries).kind == kind


def test_429_with_retry_after_waits_exactly_that_long():
    decision = decide(status(429, **{"Retry-After": "7"}))
    assert decision.kind == "throttled" and decision.retry_after == 7.0 and decision.throttle


def test_429_with_retry_after_as_http_date_is_read_against_the_server_clock():
    headers = {
        "Date": "Tue, 14 Nov 2023 22:13:20 GMT",
        "Retry-After": "Tue, 14 Nov 2023 22:13:32 GMT",
    }
    assert decide(status(429, **headers)).retry_after == pytest.approx(12.0)


def test_429_with_spent_quota_waits_for_the_reset():
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "45"}
    assert decide(status(429, **headers)).retry_after == pytest.approx(45.0)


@pytest.mark.parametrize("throttled_retries", [0, 1])
def test_429_without_hints_backs_off_with_full_jitter(throttled_retries):
    decision = decide(status(429), throttled_retries=throttled_retries)
    assert decision.kind == "throttled"
    assert 0.0 <= decision.retry_after <= LIMITS["backoff_base"] * 2**throttled_retries


def test_retry_backoff_grows_with_attempts_and_stops_at_the_cap():
    rng = random.Random(3)
    for attempts in (1, 2, 5, 30):
        limits = {**LIMITS, "max_attempts": 100}
        decision = classify(status(500), attempts=attempts, throttled_retries=0, rng=rng, **limits)
        assert 0.0 <= decision.retry_after <= min(30.0, 2 ** (attempts - 1))


def test_503_with_retry_after_is_retried_after_it():
    decision = decide(status(503, **{"Retry-After": "9"}))
    assert decision.kind == "retry" and decision.retry_after == 9.0


def test_errors_say_what_happened():
    assert decide(status(404)).error == "HTTP 404 Not Found"
    assert decide(status(500), attempts=3).error == (
        "gave up after 3 attempts: HTTP 500 Internal Server Error"
    )
    assert "Connection refused" in decide(CONNECT_ERROR, attempts=3).error
    assert "throttled" in decide(status(429), throttled_retries=2).error
    assert decide(status(299)).error == ""


def test_only_non_throttled_results_use_up_an_attempt():
    assert decide(status(500)).counts_as_attempt
    assert decide(status(200)).counts_as_attempt
    assert not decide(status(429)).counts_as_attempt
    assert not decide(status(429), throttled_retries=2).counts_as_attempt


def test_a_refused_address_fails_at_once_with_the_policy_s_reason():
    decision = decide(REFUSED, attempts=1)
    assert decision.kind == "failed" and decision.retry_after == 0
    assert decision.error == REFUSED.error and not decision.throttle


def test_a_409_is_retried_only_when_requests_carry_an_idempotency_key():
    # Stripe answers 409 while an earlier request with the same key is still being processed
    conflict = status(409)
    assert decide(conflict).kind == "failed"
    keyed = classify(conflict, attempts=1, throttled_retries=0, retry_conflicts=True,
                     rng=random.Random(1), now=1_700_000_000.0, **LIMITS)  # fmt: skip
    assert keyed.kind == "retry"
    last = classify(conflict, attempts=3, throttled_retries=0, retry_conflicts=True,
                    rng=random.Random(1), now=1_700_000_000.0, **LIMITS)  # fmt: skip
    assert last.kind == "failed"
