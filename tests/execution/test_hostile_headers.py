"""Rate-limit headers no parser can use (a number of 5,000 digits, 1e999, nan) on real responses
of a loopback server: the call keeps its response and goes on as it would without the header.
Real HTTP, the real limiter on Redis, the call stored in PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Api, Call, ThrottleEvent
from ratejobs.services.calls import call_attempt_by_id
from ratejobs.services.jobs import job_create

# Past int()'s limit of 4300 digits: int() of it raises, float() of it is inf.
HUGE = "9" * 5000
BODY = b'{"answer": "kept"}'
UNUSABLE = {
    "salesforce": {"Sforce-Limit-Info": f"api-usage={HUGE}/5"},
    "shopify": {"X-Shopify-Shop-Api-Call-Limit": f"{HUGE}/40"},
    "openai": {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": f"{HUGE}ms"},
    "x-ratelimit": {"X-RateLimit-Remaining": "nan", "X-RateLimit-Reset": "1e999"},
}
# An API's default backoff base (ExecutionPolicy): a 429 that says nothing usable blocks the
# API for it, and is retried within it.
DEFAULT_BLOCK_SECONDS = 1.0


@pytest.fixture
def server_api(services_redis: None, make_api: Any, http_server: Any, settings: Any) -> Api:
    # a worker waits long enough for a slot to wait out the 1 s blocks these tests cause
    settings.RATEJOBS_MAX_WORKER_WAIT = 5.0
    return make_api(base_url=http_server.base, credential="", rate=100.0)


def one_call(api: Api, owner: Any, path: str) -> Call:
    job = job_create(owner=owner, api=api, name="hostile headers", calls=[{"path": path}])
    return Call.objects.get(job=job)


def run_now(call: Call) -> str:
    """Run the call as a worker would, due now (its backoff skipped); returns the outcome."""
    Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now(), next_attempt_at=None)
    kind = call_attempt_by_id(call_id=call.pk)
    call.refresh_from_db()
    return kind


@pytest.mark.parametrize("dialect", UNUSABLE)
def test_a_success_with_an_unusable_header_succeeds_with_its_response_kept(
    server_api, user, http_server, marker, dialect
):
    headers = UNUSABLE[dialect]
    call = one_call(server_api, user, http_server.answer(marker, 200, headers, BODY))

    assert run_now(call) == "succeeded", call.error

    assert (call.status, call.status_code, call.error) == ("succeeded", 200, "")
    assert bytes(call.response_body) == BODY
    assert {k: call.response_headers[k] for k in headers} == headers  # stored as sent
    assert api_limiter(server_api).state().blocked_for == 0  # and nothing blocked


@pytest.mark.parametrize("dialect", ["shopify", "salesforce"])
@pytest.mark.parametrize("retry_after", ["1", None])
def test_a_429_with_an_unusable_header_is_throttled_as_without_it_then_retried(
    server_api, user, http_server, marker, dialect, retry_after
):
    # given: a 429 whose rate-limit header cannot be read, with or without a Retry-After
    headers = {**UNUSABLE[dialect], **({"Retry-After": retry_after} if retry_after else {})}
    call = one_call(server_api, user, http_server.answer(marker, 429, headers, BODY))
    before = timezone.now()

    assert run_now(call) == "throttled", call.error

    # expect: the response kept, and the throttle handled as if the header were absent: every
    # worker blocked for the Retry-After, else for the default backoff, the call due again
    # within it, without using up an attempt
    assert (call.status, call.status_code, call.error) == ("pending", 429, "HTTP 429 Too Many "
                                                           "Requests")  # fmt: skip
    assert bytes(call.response_body) == BODY
    assert (call.attempts, call.throttled_count) == (0, 1)
    wait = float(retry_after) if retry_after else DEFAULT_BLOCK_SECONDS
    assert before <= call.next_attempt_at <= timezone.now() + timedelta(seconds=wait)
    event = ThrottleEvent.objects.get(call=call, kind=ThrottleEvent.Kind.THROTTLED)
    assert event.status_code == 429 and 0 < event.retry_after <= wait
    assert 0 < api_limiter(server_api).state().blocked_for <= wait

    # and once the API answers, the retry (after the block) succeeds
    http_server.answer(marker, 200, {}, b"done")
    assert run_now(call) == "succeeded", call.error
    assert (call.status, call.status_code, call.throttled_count) == ("succeeded", 200, 1)
    assert bytes(call.response_body) == b"done"
    assert [s.path for s in http_server.requests_with(marker)] == [f"/answer/{marker}"] * 2
