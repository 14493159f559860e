"""A call's actual cost read from its response, and the limiter settled to it (real Redis, the
real sandbox in this process)."""

from __future__ import annotations

import json
import random
import threading

import pytest
import redis

from devtools.devredis import start_private_redis
from ratejobs.execution import ExecutionPolicy, HttpRequest, attempt_call
from ratejobs.limiter import Limiter, LimiterConfig
from ratejobs.limiter.config import MAX_COST, Window
from ratejobs.limiter.cost import COST_JSON_FIELD, cost_from_response, parse_cost
from sandbox import Sandbox


def body(value: object) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    "headers, payload, expected",
    [
        ({"X-Tokens-Used": "70"}, b"", 70),
        ({"x-tokens-used": " 70 "}, b"", 70),  # any case, spaces around
        ({}, body({"usage": {"total_tokens": 12}}), 12),
        ({}, body({"usage": {"total_tokens": 12.0}}), 12),  # a whole float
        ({"X-Tokens-Used": "lots"}, body({"usage": {"total_tokens": 9}}), 9),  # header garbled
        ({"X-Tokens-Used": "5"}, body({"usage": {"total_tokens": 9}}), 5),  # the header first
        ({}, body({"data": [{"tokens": 4}]}), None),  # path does not match
        ({}, body({"usage": {"total_tokens": -3}}), None),
        ({}, body({"usage": {"total_tokens": 2.5}}), None),
        ({}, body({"usage": {"total_tokens": True}}), None),
        ({}, body({"usage": {"total_tokens": "11"}}), 11),
        ({}, body({"usage": {"total_tokens": MAX_COST + 1}}), None),
        ({}, body({"usage": 5}), None),
        ({}, b'{"usage": {"total_tokens": 1', None),  # truncated
        ({}, b"\xff\xfe{not json", None),
        ({}, b"plain text 42", None),
        ({"X-Tokens-Used": "-1"}, b"", None),
        ({"X-Tokens-Used": "1e3"}, b"", None),
        ({"X-Tokens-Used": "٣"}, b"", None),  # a digit, but not an ASCII one
    ],
)
def test_cost_is_read_from_the_header_or_the_json_field_and_garbage_is_ignored(
    headers, payload, expected
):
    found = cost_from_response(
        headers, payload, header="X-Tokens-Used", json_field="usage.total_tokens"
    )
    assert found == expected


def test_a_number_segment_of_the_json_path_indexes_a_list():
    payload = body({"choices": [{"tokens": 3}, {"tokens": 8}]})
    assert cost_from_response({}, payload, json_field="choices.1.tokens") == 8
    assert cost_from_response({}, payload, json_field="choices.2.tokens") is None


def test_without_a_header_or_field_configured_nothing_is_read():
    assert cost_from_response({"X-Tokens-Used": "7"}, body({"usage": 7})) is None


def test_a_deeply_nested_body_is_no_error():
    assert cost_from_response({}, b"[" * 100_000, json_field="a") is None


@pytest.mark.parametrize("value", [0, 1, MAX_COST, "0", "17"])
def test_parse_cost_takes_whole_numbers_in_range(value):
    assert parse_cost(value) == int(value)


@pytest.mark.parametrize("path", ["usage.total_tokens", "a", "choices.0.n", "x-y_z"])
def test_cost_json_field_shape_takes_dotted_names(path):
    assert COST_JSON_FIELD.fullmatch(path)


@pytest.mark.parametrize("path", ["", ".a", "a.", "a..b", "a b", "a/b", "a[0]"])
def test_cost_json_field_shape_refuses_others(path):
    assert not COST_JSON_FIELD.fullmatch(path)


# -- attempt_call settles the limiter to what the response said ------------------------------

TOKEN_WINDOW = Window(rate=1000, period=60, burst=1000, unit="cost")


@pytest.fixture
def token_sandbox():
    # a sandbox that reports the tokens each request names (?tokens=N), no budget of its own
    server = Sandbox(rate=1000, burst=100).start()
    yield server
    server.stop()


def attempt(
    limiter, session, url: str, *, cost: int, policy: ExecutionPolicy, return_lease: bool = True
):
    return attempt_call(
        HttpRequest("GET", url, {}),
        limiter=limiter,
        session=session,
        policy=policy,
        attempts=1,
        throttled_retries=0,
        max_wait=1.0,
        rng=random.Random(0),
        cost=cost,
        return_lease=return_lease,
    )


def tokens_left(limiter) -> float:
    (window,) = limiter.state().windows
    return window.remaining


@pytest.mark.parametrize(
    "policy",
    [
        ExecutionPolicy(cost_header="X-Tokens-Used"),
        ExecutionPolicy(cost_json_field="usage.total_tokens"),
    ],
    ids=["header", "json field"],
)
def test_the_actual_cost_is_settled_with_the_limiter_over_and_under_the_estimate(
    token_sandbox, session, make_limiter, policy
):
    limiter = make_limiter(LimiterConfig(rate=1000, burst=100, windows=(TOKEN_WINDOW,)))
    # given an estimate of 50 for a call that used 70, and one of 50 for a call that used 20
    over = attempt(limiter, session, f"{token_sandbox.url}/items/1?tokens=70", cost=50,
                   policy=policy)  # fmt: skip
    under = attempt(limiter, session, f"{token_sandbox.url}/items/2?tokens=20", cost=50,
                    policy=policy)  # fmt: skip
    # expect: both succeed and say what they used; the window holds 90 taken, not 100
    assert (over.kind, under.kind) == ("succeeded", "succeeded")
    assert (over.cost_used, under.cost_used) == (70, 20)
    assert over.limiter_error == under.limiter_error == ""
    assert 1000 - 90 <= tokens_left(limiter) < 1000 - 90 + 2  # refilling at 1000/min meanwhile


def test_the_settle_rides_with_the_lease_and_costs_no_round_trip_of_its_own(
    token_sandbox, session, make_limiter
):
    # (an in-flight cap: without one a grant holds no lease, and a settle goes on its own)
    limiter = make_limiter(
        LimiterConfig(rate=1000, burst=100, max_concurrency=10, windows=(TOKEN_WINDOW,))
    )
    url = f"{token_sandbox.url}/items/1?tokens=70"
    counted = ExecutionPolicy(cost_header="X-Tokens-Used")
    # given the same call once without and once with its cost read from the response
    trips = limiter.round_trips
    attempt(limiter, session, url, cost=70, policy=ExecutionPolicy())
    plain = limiter.round_trips - trips
    trips = limiter.round_trips
    own = attempt(limiter, session, url, cost=50, policy=counted)
    # expect: returning its own lease, the attempt settled 20 more in the same round trip
    assert limiter.round_trips - trips == plain
    assert own.cost_used == 70 and own.lease is None
    assert 1000 - 140 <= tokens_left(limiter) < 1000 - 140 + 2
    # and handing its lease back (return_lease=False), it leaves the settle to whoever returns
    # the lease, which does both in one round trip (the worker's recorder, for a batch)
    handed = attempt(limiter, session, f"{token_sandbox.url}/items/2?tokens=20", cost=50,
                     policy=counted, return_lease=False)  # fmt: skip
    assert handed.cost_used == 20 and handed.lease is not None
    assert 1000 - 190 <= tokens_left(limiter) < 1000 - 190 + 2  # the estimate, so far
    trips = limiter.round_trips
    limiter.release_many([handed.lease], settles=[(handed.lease, handed.cost_used)])
    assert limiter.round_trips - trips == 1
    assert 1000 - 160 <= tokens_left(limiter) < 1000 - 160 + 2


def test_a_response_that_reports_no_cost_leaves_the_estimate_charged(
    token_sandbox, session, make_limiter
):
    limiter = make_limiter(LimiterConfig(rate=1000, burst=100, windows=(TOKEN_WINDOW,)))
    policy = ExecutionPolicy(cost_header="X-Not-There")
    outcome = attempt(limiter, session, f"{token_sandbox.url}/items/1?tokens=70", cost=50,
                      policy=policy)  # fmt: skip
    assert outcome.kind == "succeeded" and outcome.cost_used is None
    assert 1000 - 50 <= tokens_left(limiter) < 1000 - 50 + 2


def test_a_cost_above_the_smallest_cost_burst_fails_the_call_and_sends_nothing(
    token_sandbox, session, make_limiter
):
    limiter = make_limiter(LimiterConfig(rate=1000, burst=100, windows=(TOKEN_WINDOW,)))
    outcome = attempt(limiter, session, f"{token_sandbox.url}/items/1", cost=1001,
                      policy=ExecutionPolicy())  # fmt: skip
    assert outcome.kind == "failed" and not outcome.sent
    assert "1001" in outcome.error
    assert token_sandbox.stats()["arrivals"] == 0


def test_a_settle_that_fails_is_logged_and_the_result_kept(session, caplog):
    # given a limiter on a Redis of its own that goes away while the request is on the wire
    server = Sandbox(rate=1000, burst=100, latency=0.5).start()
    private = start_private_redis()
    client = redis.Redis.from_url(private.url, socket_connect_timeout=0.5, socket_timeout=0.5)
    limiter = Limiter(client, "settle-fails", LimiterConfig(rate=100, windows=(TOKEN_WINDOW,)))
    limiter.configure(limiter.config)
    stopper = threading.Timer(0.15, private.stop)
    try:
        stopper.start()
        outcome = attempt(limiter, session, f"{server.url}/items/1?tokens=70", cost=50,
                          policy=ExecutionPolicy(cost_header="X-Tokens-Used"))  # fmt: skip
    finally:
        stopper.join()
        server.stop()
        private.stop()
    # expect: the response is the attempt's result all the same, with the cost it reported;
    # the settle's failure is logged (the lease expires by itself)
    assert outcome.kind == "succeeded" and outcome.cost_used == 70
    assert outcome.limiter_error
    assert "actual cost 70 not settled" in caplog.text
