"""Retry-After and quota headers, read back with the parser the workers use."""

from __future__ import annotations

import time

import pytest

from ratejobs.limiter.headers import parse_quota, parse_retry_after


def exhaust(session, url: str, burst: int):
    """The first 429 after spending the burst."""
    for _ in range(burst):
        assert session.get(url).status_code == 200
    response = session.get(url)
    assert response.status_code == 429
    return response


def test_429_carries_retry_after_in_whole_seconds_rounded_up(make_sandbox, session):
    # given 1/s: the next slot is at most 1 s away, which reads "1"
    sandbox = make_sandbox(rate=1, burst=2)
    response = exhaust(session, sandbox.url + "/x", 2)
    assert response.headers["Retry-After"] == "1"
    assert response.json() == {"error": "rate limited"}


def test_no_retry_after_leaves_it_out(make_sandbox, session):
    sandbox = make_sandbox(rate=1, burst=2, retry_after=False)
    response = exhaust(session, sandbox.url + "/x", 2)
    assert "Retry-After" not in response.headers
    assert sandbox.stats(detail=True)["log"][-1]["retry_after"] is None


def test_retry_after_as_http_date_is_a_whole_second_after_the_next_slot(make_sandbox, session):
    # given 1 per 3 s: the next slot is about 3 s away
    sandbox = make_sandbox(rate=1, period=3, burst=1, retry_after_format="date")
    before = time.time()
    response = exhaust(session, sandbox.url + "/x", 1)
    value = response.headers["Retry-After"]
    assert value.endswith(" GMT")
    wait = parse_retry_after(value, now=before)
    assert 2.5 <= wait <= 4.1


def test_github_headers_count_down_and_parse(make_sandbox, session):
    sandbox = make_sandbox(rate=5, burst=3, headers="github")
    now = time.time()
    hints = [parse_quota(session.get(sandbox.url + "/x").headers, now=now) for _ in range(4)]
    assert {hint.source for hint in hints} == {"x-ratelimit"}
    assert {hint.limit for hint in hints} == {5}
    # the remaining count falls with the burst (and may have regained one meanwhile)
    assert hints[0].remaining == 2
    assert hints[-1].remaining <= 1
    # Reset is an epoch rounded up to a whole second: at most a second or two from now
    assert all(0 < hint.reset_after <= 2 for hint in hints)


def test_ietf_headers_name_the_policy_and_parse(make_sandbox, session):
    sandbox = make_sandbox(rate=20, period=2, burst=4, headers="ietf")
    response = session.get(sandbox.url + "/x")
    assert response.headers["RateLimit-Policy"] == '"default";q=20;w=2'
    assert response.headers["RateLimit"].startswith('"default";r=3;t=')
    hint = parse_quota(response.headers, now=time.time())
    assert (hint.source, hint.policy, hint.limit, hint.window, hint.remaining) == (
        "ratelimit",
        "default",
        20,
        2.0,
        3,
    )
    assert hint.reset_after == 1  # 100 ms of debt, rounded up


def test_ietf_headers_on_a_429_say_the_quota_is_spent(make_sandbox, session):
    sandbox = make_sandbox(rate=1, burst=1, headers="ietf")
    response = exhaust(session, sandbox.url + "/x", 1)
    hint = parse_quota(response.headers, now=time.time())
    assert hint.exhausted
    assert hint.reset_after >= 1


@pytest.mark.parametrize("path", ["/x", "/status/404", "/__stats"])
def test_headers_none_sends_no_quota_headers(make_sandbox, session, path):
    sandbox = make_sandbox(headers="none")
    response = session.get(sandbox.url + path)
    assert parse_quota(response.headers, now=time.time()) is None


def test_openai_headers_count_requests_down_and_parse(make_sandbox, session):
    # given 4 per 2 s with a burst of 4: each request puts the full quota 500 ms further off
    sandbox = make_sandbox(rate=4, period=2, burst=4, headers="openai")
    responses = [session.get(sandbox.url + "/x") for _ in range(4)]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in responses] == ["3", "2", "1", "0"]
    assert {r.headers["x-ratelimit-limit-requests"] for r in responses} == {"4"}
    last = responses[-1].headers["x-ratelimit-reset-requests"]
    assert last.endswith("s") and not last.startswith("-")
    hint = parse_quota(responses[-1].headers, now=time.time())
    assert (hint.source, hint.policy, hint.limit, hint.remaining) == ("openai", "requests", 4, 0)
    # four requests of 500 ms each, less the moments between them, rounded up to a millisecond
    assert 1.5 < hint.reset_after <= 2.001


def test_anthropic_headers_reset_at_a_whole_second_never_early(make_sandbox, session):
    sandbox = make_sandbox(rate=2, period=1, burst=2, headers="anthropic")
    before = time.time()
    responses = [session.get(sandbox.url + "/x") for _ in range(2)]
    headers = responses[-1].headers
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    hint = parse_quota(headers, now=time.time())
    assert (hint.source, hint.policy, hint.limit, hint.remaining) == (
        "anthropic",
        "requests",
        2,
        0,
    )
    # a second of debt, rounded up to the next whole second and measured against a Date that
    # has whole seconds too: at least the second, at most about three
    reset = parse_quota(headers, now=before).reset_after
    assert 0.9 <= reset <= 3.0


def test_shopify_header_fills_the_bucket(make_sandbox, session):
    sandbox = make_sandbox(rate=2, period=1, burst=3, headers="shopify")
    values = [session.get(sandbox.url + "/x").headers["X-Shopify-Shop-Api-Call-Limit"]
              for _ in range(3)]  # fmt: skip
    assert values == ["1/3", "2/3", "3/3"]
    hint = parse_quota({"X-Shopify-Shop-Api-Call-Limit": values[-1]}, now=time.time())
    assert (hint.source, hint.remaining, hint.reset_after) == ("shopify", 0, 0.5)
