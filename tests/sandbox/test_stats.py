"""/__stats, /__reset and /__config: what tests and benchmarks read and change on a sandbox."""

from __future__ import annotations

import time

import pytest

from ratejobs.limiter.headers import parse_retry_after


def test_stats_count_statuses_and_log_each_arrival(make_sandbox, session):
    sandbox = make_sandbox(rate=1, burst=3)
    before = time.time()
    statuses = [
        session.get(sandbox.url + f"/items/{i}", headers={"X-Request-Id": f"req-{i}"}).status_code
        for i in range(4)
    ]
    after = time.time()
    assert statuses == [200, 200, 200, 429]
    stats = session.get(sandbox.url + "/__stats?detail=1").json()
    assert (stats["arrivals"], stats["ok"], stats["throttled"], stats["errors"]) == (4, 3, 1, 0)
    assert stats["by_status"] == {"200": 3, "429": 1}
    assert (stats["window"], stats["allowed"]) == (1.0, 3 + 1)
    assert (stats["worst_window"], stats["worst_window_admitted"]) == (4, 3)
    assert (stats["log_size"], stats["log_dropped"]) == (4, 0)
    log = stats["log"]
    assert [e["n"] for e in log] == [1, 2, 3, 4]
    assert [e["request_id"] for e in log] == ["req-0", "req-1", "req-2", "req-3"]
    assert [e["path"] for e in log] == [f"/items/{i}" for i in range(4)]
    assert [e["status"] for e in log] == statuses
    times = [e["t"] for e in log]
    assert times == sorted(times)
    assert before - 0.05 <= times[0] and times[-1] <= after + 0.05
    throttled = log[-1]
    assert throttled["retry_after"] == 1
    assert throttled["t"] <= throttled["sent"]
    assert throttled["retry_until"] == pytest.approx(throttled["sent"] + 1)


def test_stats_are_not_arrivals_and_are_never_limited(make_sandbox, session):
    sandbox = make_sandbox(rate=1, burst=1)
    session.get(sandbox.url + "/x")
    for _ in range(10):
        assert session.get(sandbox.url + "/__stats").status_code == 200
    assert sandbox.stats()["arrivals"] == 1


def test_stats_window_parameter_sets_the_window_and_its_bound(make_sandbox, session):
    sandbox = make_sandbox(rate=20, burst=5, no_limit=True)
    for _ in range(8):
        session.get(sandbox.url + "/x")
    stats = session.get(sandbox.url + "/__stats?window=0.5").json()
    assert stats["window"] == 0.5
    assert stats["worst_window"] == 8
    assert stats["allowed"] is None  # no limit, no bound
    sandbox.configure(no_limit=False)
    assert session.get(sandbox.url + "/__stats?window=0.5").json()["allowed"] == 5 + 10
    assert session.get(sandbox.url + "/__stats?window=-1").status_code == 400


def test_retry_after_violations_count_a_client_that_ignores_retry_after(make_sandbox, session):
    # given 1/s burst 1: the second request is throttled with Retry-After: 1
    sandbox = make_sandbox(rate=1, burst=1)
    url = sandbox.url + "/x"
    assert [session.get(url).status_code for _ in range(2)] == [200, 429]
    # when the client sends three more at once, as if it had not been told anything
    for _ in range(3):
        session.get(url)
    # expect: each of the three came before the first 429's Retry-After ran out
    assert sandbox.stats()["retry_after_violations"] == 3


@pytest.mark.parametrize("retry_after_format", ["delta", "date"])
def test_retry_after_violations_spare_a_client_that_obeys(
    make_sandbox, session, retry_after_format
):
    sandbox = make_sandbox(rate=1, burst=1, retry_after_format=retry_after_format)
    url = sandbox.url + "/x"
    assert session.get(url).status_code == 200
    throttled = session.get(url)
    assert throttled.status_code == 429
    # the obedient client waits what it was told, on its own clock, from when it got the 429
    time.sleep(parse_retry_after(throttled.headers["Retry-After"], now=time.time()))
    assert session.get(url).status_code == 200
    assert sandbox.stats()["retry_after_violations"] == 0


def test_reset_clears_counters_log_and_bucket(make_sandbox, session):
    sandbox = make_sandbox(rate=1, burst=2)
    for _ in range(4):
        session.get(sandbox.url + "/x")
    assert session.get(sandbox.url + "/__reset").status_code == 405
    assert session.post(sandbox.url + "/__reset").json() == {"reset": True}
    stats = sandbox.stats(detail=True)
    assert (stats["arrivals"], stats["throttled"], stats["log"]) == (0, 0, [])
    # the whole burst is back at once, and arrivals count from 1 again
    assert [session.get(sandbox.url + "/x").json()["n"] for _ in range(2)] == [1, 2]


def test_config_changes_limits_and_headers_live(make_sandbox, session):
    sandbox = make_sandbox(rate=2, burst=1, headers="github")
    url = sandbox.url + "/x"
    assert session.get(url).headers["X-RateLimit-Limit"] == "2"
    assert session.get(url).status_code == 429
    # when the rate, burst and header style change on the running server
    new = session.post(
        sandbox.url + "/__config", json={"rate": 1000, "burst": 50, "headers": "ietf"}
    ).json()
    assert (new["rate"], new["burst"], new["headers"]) == (1000.0, 50, "ietf")
    assert session.get(sandbox.url + "/__config").json() == new
    # expect: the next requests are judged and described by the new config (the one request
    # spent at 2/s is one request spent at 1000/s, well within the new burst of 50)
    responses = [session.get(url) for _ in range(20)]
    assert {r.status_code for r in responses} == {200}
    assert responses[0].headers["RateLimit-Policy"] == '"default";q=1000;w=1'
    assert "X-RateLimit-Limit" not in responses[0].headers
    # ... latency and errors too
    session.post(sandbox.url + "/__config", json={"error_rate": 1.0, "latency": 0.1})
    started = time.monotonic()
    assert session.get(url).status_code == 500
    assert time.monotonic() - started >= 0.1


@pytest.mark.parametrize(
    "body",
    [
        b'{"rate": -1}',
        b'{"burst": 0}',
        b'{"burst": true}',
        b'{"rate": "fast"}',
        b'{"headers": "rfc"}',
        b'{"error_rate": 1.5}',
        b'{"port": 80}',
        b'{"bogus": 1}',
        b'{"idempotency_header": "Idempotency Key"}',
        b'{"max_idempotency_keys": -1}',
        b"[1, 2]",
        b"not json",
    ],
)
def test_config_rejects_bad_changes_and_keeps_the_old_config(make_sandbox, session, body):
    sandbox = make_sandbox(rate=7, burst=2)
    before = session.get(sandbox.url + "/__config").json()
    response = session.post(sandbox.url + "/__config", data=body)
    assert response.status_code == 400
    assert "error" in response.json()
    assert session.get(sandbox.url + "/__config").json() == before


def test_real_rate_follows_rate_until_set(make_sandbox):
    sandbox = make_sandbox(rate=10, burst=1)
    assert sandbox.configure(rate=20).enforced_rate == 20
    assert sandbox.configure(real_rate=5).enforced_rate == 5
    assert sandbox.configure(rate=40).enforced_rate == 5
    assert sandbox.configure(real_rate=None).enforced_rate == 40
