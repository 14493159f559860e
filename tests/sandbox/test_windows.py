"""Windows enforced besides the main limit, over HTTP: who refuses, for how long, and what the
headers and /__stats say."""

from __future__ import annotations

import time

from ratejobs.limiter.headers import parse_quota
from sandbox import start_sandbox_process
from tests.sandbox.conftest import worst_window_excess


def test_a_window_refuses_with_its_own_retry_after(make_sandbox, session):
    # given 100/s burst 10, and windows of 2 per 10 s and 3 per 60 s
    sandbox = make_sandbox(rate=100, burst=10, windows=((2, 10), (3, 60)))
    url = sandbox.url + "/x"
    responses = [session.get(url) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    # expect: the 2-per-10-s window refused and asked for its next slot, 5 s off (the main
    # bucket would have admitted at once, the other window too)
    assert 4 <= int(responses[-1].headers["Retry-After"]) <= 5
    stats = sandbox.stats(detail=True)
    assert stats["throttled_by"] == {"main": 0, "window:0": 1, "window:1": 0, "tokens": 0}
    assert stats["log"][-1]["cause"] == "window:0"
    assert stats["log"][-1]["retry_after"] == int(responses[-1].headers["Retry-After"])
    assert [w["worst_window_admitted"] for w in stats["windows"]] == [2, 2]
    assert [w["allowed"] for w in stats["windows"]] == [2 + 2, 3 + 3]
    assert stats["windows"][1] == {
        "rate": 3.0,
        "period": 60.0,
        "burst": 3,
        "worst_window_admitted": 2,
        "allowed": 6.0,
    }


def test_github_headers_advertise_the_tightest_window(make_sandbox, session):
    # given 100/s burst 10 and a window of 3 per 10 s
    sandbox = make_sandbox(rate=100, burst=10, windows=((3, 10),), headers="github")
    headers = [session.get(sandbox.url + "/x").headers for _ in range(2)]
    assert [h["X-RateLimit-Limit"] for h in headers] == ["3", "3"]
    assert [h["X-RateLimit-Remaining"] for h in headers] == ["2", "1"]
    hint = parse_quota(headers[-1], now=time.time())
    assert hint.limit == 3 and 5 < hint.reset_after <= 8  # two requests of 3.3 s, rounded up


def test_ietf_headers_list_every_window(make_sandbox, session):
    sandbox = make_sandbox(rate=20, burst=5, windows=((300, 60, 50),), headers="ietf")
    response = session.get(sandbox.url + "/x")
    assert response.headers["RateLimit-Policy"] == '"default";q=20;w=1, "window:0";q=300;w=60'
    assert response.headers["RateLimit"] == '"default";r=4;t=1, "window:0";r=49;t=1'
    hint = parse_quota(response.headers, now=time.time())
    assert (hint.policy, hint.remaining) == ("default", 4)  # the tightest, as a client reads it


def test_windows_change_live_and_read_back(make_sandbox, session):
    sandbox = make_sandbox(rate=100, burst=10)
    url = sandbox.url + "/x"
    assert session.get(url).status_code == 200
    changed = session.post(sandbox.url + "/__config", json={"windows": [[1, 10]]}).json()
    assert changed["windows"] == [[1.0, 10.0, 1]]
    assert session.get(sandbox.url + "/__config").json()["windows"] == [[1.0, 10.0, 1]]
    # the new window starts full: one more request, then 429s from it for about 10 s
    assert [session.get(url).status_code for _ in range(2)] == [200, 429]
    assert sandbox.stats()["throttled_by"]["window:0"] == 1
    bad = session.post(sandbox.url + "/__config", json={"windows": [[1, 10, 0]]})
    assert bad.status_code == 400 and "burst" in bad.json()["error"]
    assert session.post(sandbox.url + "/__config", json={"windows": []}).json()["windows"] == []
    assert session.get(url).status_code == 200


def test_a_client_too_fast_for_a_window_is_held_to_it(make_sandbox, session):
    # given a main limit the client keeps (it sends at most 50/s against 100/s) and a window of
    # 10 per 0.5 s with a burst of 5 that it does not: 40 requests in about 0.8 s
    rate, period, burst = 10, 0.5, 5
    sandbox = make_sandbox(rate=100, burst=10, windows=((rate, period, burst),))
    for _ in range(40):
        session.get(sandbox.url + "/x")
        time.sleep(0.02)
    stats = sandbox.stats(detail=True)
    # expect: only the window throttled, and every stretch of admitted arrivals keeps its bound
    assert stats["throttled_by"]["window:0"] > 0
    assert stats["throttled_by"]["main"] == 0
    assert stats["windows"][0]["worst_window_admitted"] <= stats["windows"][0]["allowed"]
    admitted = [entry["t"] for entry in stats["log"] if entry["status"] == 200]
    assert worst_window_excess(admitted, rate=rate, period=period, burst=burst) <= 0


def test_process_takes_windows_and_token_budget_from_the_command_line(session):
    sandbox = start_sandbox_process(
        rate=100, burst=10, windows=((2, 10),), token_rate=50, token_period=5, headers="openai"
    )
    try:
        config = sandbox.stats()["config"]
        assert (config["windows"], config["token_rate"], config["token_period"]) == (
            [[2.0, 10.0, 2]],
            50.0,
            5.0,
        )
        response = session.get(sandbox.url + "/x?tokens=20")
        assert response.headers["x-ratelimit-remaining-tokens"] == "30"
        assert response.headers["x-ratelimit-limit-requests"] == "2"  # the window is tighter
    finally:
        sandbox.stop()


def test_each_credential_has_windows_and_a_token_budget_of_its_own(make_sandbox, session):
    # given --limit-by-header Authorization, a window of 1 per 60 s and 10 tokens per 60 s
    sandbox = make_sandbox(
        rate=100,
        burst=10,
        limit_by_header="Authorization",
        windows=((1, 60),),
        token_rate=10,
        token_period=60,
    )
    url = sandbox.url + "/x?tokens=10"
    statuses = [
        session.get(url, headers={"Authorization": f"Bearer {who}"}).status_code
        for who in ("a", "b", "a", "b")
    ]
    # expect: each credential spends its own window and budget once
    assert statuses == [200, 200, 429, 429]
    assert sandbox.stats()["tokens"]["admitted"] == 20
