"""The token budget over HTTP: requests admitted or refused by the tokens they ask for, usage
reported back, and the AI header styles counting tokens."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from ratejobs.limiter.headers import parse_quota
from tests.sandbox.conftest import worst_window_excess

USED = "X-Tokens-Used"


def test_token_budget_admits_and_refuses_by_the_tokens_asked_for(make_sandbox, session):
    # given 10 tokens per 10 s (one a second) all at once, and a loose request limit
    sandbox = make_sandbox(rate=100, burst=10, token_rate=10, token_period=10)
    url = sandbox.url + "/v1/chat"
    first = session.get(url, params={"tokens": 8})
    assert first.status_code == 200
    assert first.json()["usage"] == {"total_tokens": 8}
    assert first.headers[USED] == "8"
    # when the next asks for 7 with 2 left: 5 short, 5 s at one a second
    refused = session.get(url, params={"tokens": 7})
    assert refused.status_code == 429
    assert 4 <= int(refused.headers["Retry-After"]) <= 5
    assert refused.headers[USED] == "0"
    # ... while 2 still fit
    assert session.get(url, params={"tokens": 2}).status_code == 200
    stats = sandbox.stats(detail=True)
    assert stats["throttled_by"] == {"main": 0, "tokens": 1}
    assert [(e["tokens"], e.get("cause")) for e in stats["log"]] == [
        (8, None),
        (0, "tokens"),
        (2, None),
    ]
    assert stats["tokens"] == {
        "budget": True,
        "admitted": 10,
        "throttled": 1,
        "window": 10.0,
        "worst_window": 10,
        "allowed": 10 + 10.0,
    }


def test_the_query_wins_over_the_json_body_and_the_default_is_one(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True, token_rate=100, token_period=1)
    url = sandbox.url + "/v1/chat"
    assert session.post(url, json={"tokens": 5}).headers[USED] == "5"
    assert session.post(url + "?tokens=3", json={"tokens": 5}).headers[USED] == "3"
    assert session.post(url, json={"prompt": "hi"}).json()["usage"] == {"total_tokens": 1}
    assert session.get(url).headers[USED] == "1"
    assert session.get(url + "?tokens=0").headers[USED] == "0"
    assert sandbox.stats()["tokens"]["admitted"] == 5 + 3 + 1 + 1


@pytest.mark.parametrize(
    ("query", "body"),
    [("?tokens=abc", None), ("?tokens=-1", None), ("?tokens=101", None), ("", {"tokens": 1.5})],
)
def test_bad_or_impossible_token_counts_answer_400(make_sandbox, session, query, body):
    # given a budget whose burst is 100: 101 tokens could never be admitted
    sandbox = make_sandbox(rate=100, burst=10, token_rate=100, token_period=1)
    response = session.post(sandbox.url + "/v1/chat" + query, json=body)
    assert response.status_code == 400
    assert "tokens" in response.json()["error"]
    assert response.headers[USED] == "0"
    assert sandbox.stats()["tokens"]["admitted"] == 0


def test_without_a_budget_usage_is_reported_only_when_asked(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True)
    plain = session.get(sandbox.url + "/x")
    assert "usage" not in plain.json() and USED not in plain.headers
    named = session.get(sandbox.url + "/x?tokens=7")
    assert (named.json()["usage"], named.headers[USED]) == ({"total_tokens": 7}, "7")
    assert sandbox.stats()["tokens"]["allowed"] is None


def test_openai_headers_count_the_token_budget(make_sandbox, session):
    # given 1000 tokens per 600 s (600 ms a token: none comes back during the test) and 20
    # requests a second
    sandbox = make_sandbox(rate=20, burst=5, token_rate=1000, token_period=600, headers="openai")
    headers = session.get(sandbox.url + "/v1/chat?tokens=250").headers
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "750"
    # 250 tokens refill in 150 s, as Go prints a duration
    assert headers["x-ratelimit-reset-tokens"] == "2m30s"
    assert headers["x-ratelimit-remaining-requests"] == "4"
    # the worker's parser sees both dimensions; the requests one has fewer left
    assert parse_quota(headers, now=time.time()).policy == "requests"
    # when the budget is spent, the tokens dimension is the one a client must wait for
    spent = session.get(sandbox.url + "/v1/chat?tokens=750").headers
    assert spent["x-ratelimit-remaining-tokens"] == "0"
    hint = parse_quota(spent, now=time.time())
    assert (hint.policy, hint.remaining, hint.limit) == ("tokens", 0, 1000)
    assert 599 < hint.reset_after <= 600


def test_anthropic_headers_count_the_token_budget(make_sandbox, session):
    sandbox = make_sandbox(rate=20, burst=5, token_rate=100, token_period=1, headers="anthropic")
    headers = session.get(sandbox.url + "/v1/messages?tokens=100").headers
    assert headers["anthropic-ratelimit-tokens-limit"] == "100"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "0"
    assert headers["anthropic-ratelimit-tokens-reset"].endswith("Z")
    hint = parse_quota(headers, now=time.time())
    assert (hint.policy, hint.remaining) == ("tokens", 0)


def test_ietf_headers_name_the_token_unit(make_sandbox, session):
    sandbox = make_sandbox(rate=20, burst=5, token_rate=1000, token_period=60, headers="ietf")
    response = session.get(sandbox.url + "/x?tokens=10")
    assert response.headers["RateLimit-Policy"] == (
        '"default";q=20;w=1, "tokens";q=1000;w=60;qu="tokens"'
    )
    assert response.headers["RateLimit"].endswith('"tokens";r=990;t=1')


def test_token_budget_changes_live(make_sandbox, session):
    sandbox = make_sandbox(rate=100, burst=10)
    url = sandbox.url + "/x?tokens=6"
    assert session.get(url).status_code == 200
    changed = session.post(
        sandbox.url + "/__config", json={"token_rate": 10, "token_period": 10, "token_burst": 8}
    ).json()
    assert (changed["token_rate"], changed["token_period"], changed["token_burst"]) == (10, 10, 8)
    # the budget starts full: 6 of 8, then 6 more do not fit
    assert [session.get(url).status_code for _ in range(2)] == [200, 429]
    session.post(sandbox.url + "/__config", json={"token_rate": None})
    assert session.get(url).status_code == 200


def send_tokens(url: str, sizes: list[int], statuses: list[int]) -> None:
    with requests.Session() as client:
        client.trust_env = False
        for tokens in sizes:
            statuses.append(client.get(url, params={"tokens": tokens}).status_code)
            time.sleep(0.01)


def test_tokens_admitted_keep_the_budget_in_every_window(make_sandbox):
    # given 200 tokens a second with 100 at once, and 3 clients asking for 5 to 40 tokens each
    # about 100 times a second between them (some 2,000 tokens a second)
    rate, burst = 200, 100
    sandbox = make_sandbox(rate=1000, burst=100, token_rate=rate, token_period=1, token_burst=burst)
    statuses: list[list[int]] = [[], [], []]
    threads = [
        threading.Thread(
            target=send_tokens, args=(sandbox.url + "/v1/chat", [5, 40, 15, 25] * 10, out)
        )
        for out in statuses
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stats = sandbox.stats(detail=True)
    # expect: the budget refused some, and no window of 1 s held more than 100 + 200 tokens,
    # by the server's count and ours
    assert stats["throttled_by"]["tokens"] > 0
    assert stats["tokens"]["worst_window"] <= stats["tokens"]["allowed"] == burst + rate
    admitted = [(e["t"], e["tokens"]) for e in stats["log"] if e["status"] == 200]
    assert sum(tokens for _, tokens in admitted) == stats["tokens"]["admitted"]
    excess = worst_window_excess(
        [t for t, _ in admitted],
        weights=[tokens for _, tokens in admitted],
        rate=rate,
        period=1,
        burst=burst,
    )
    assert excess <= 0
