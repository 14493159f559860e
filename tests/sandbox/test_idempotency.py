"""Idempotency keys: a repeated key gets the first answer again and is no new arrival."""

from __future__ import annotations

import threading
import time

import pytest
import requests

KEY = "Idempotency-Key"


def test_a_repeated_key_gets_the_first_answer_again_and_is_no_arrival(make_sandbox, session):
    sandbox = make_sandbox(rate=100, burst=10)
    url = sandbox.url + "/charges"
    first = session.post(url, headers={KEY: "order-1"}, data=b"{}")
    again = [session.post(url, headers={KEY: "order-1"}, data=b"{}") for _ in range(3)]
    other = session.post(url, headers={KEY: "order-2"}, data=b"{}")
    # expect: the same status and body (its "n" is the first arrival's), marked as replayed
    assert first.status_code == 200
    assert "Idempotent-Replayed" not in first.headers
    for response in again:
        assert (response.status_code, response.json()) == (200, first.json())
        assert response.headers["Idempotent-Replayed"] == "true"
    assert other.json()["n"] == 2
    stats = sandbox.stats(detail=True)
    assert (stats["arrivals"], stats["idempotent_replays"], stats["unique_keys"]) == (2, 3, 2)
    assert stats["log_dropped"] == 0
    assert [e["idempotency_key"] for e in stats["log"]] == ["order-1", "order-2"]


def test_a_replay_is_not_charged_to_the_limit(make_sandbox, session):
    # given a burst of 2, one of them spent on a request with a key
    sandbox = make_sandbox(rate=1, burst=2, retry_after=False)
    url = sandbox.url + "/x"
    assert session.get(url, headers={KEY: "k"}).status_code == 200
    # when that request is repeated again and again
    assert {session.get(url, headers={KEY: "k"}).status_code for _ in range(5)} == {200}
    # expect: the second of the burst is still there for a new request, and only then 429
    assert [session.get(url).status_code for _ in range(2)] == [200, 429]
    assert sandbox.stats()["throttled"] == 1


def test_a_key_answered_429_is_not_remembered(make_sandbox, session):
    # given the only request of the burst spent, and a request with a key throttled
    sandbox = make_sandbox(rate=1, burst=1)
    url = sandbox.url + "/x"
    assert session.get(url).status_code == 200
    assert session.get(url, headers={KEY: "retry-me"}).status_code == 429
    # when the client retries with the same key once the limit allows it
    sandbox.configure(no_limit=True)
    retried = session.get(url, headers={KEY: "retry-me"})
    # expect: the retry goes through as a new arrival, and is what is remembered
    assert retried.status_code == 200
    assert "Idempotent-Replayed" not in retried.headers
    assert session.get(url, headers={KEY: "retry-me"}).json() == retried.json()
    stats = sandbox.stats()
    assert (stats["arrivals"], stats["idempotent_replays"], stats["unique_keys"]) == (3, 1, 1)


@pytest.mark.parametrize(("path", "options"), [("/status/503", {}), ("/x", {"error_rate": 1.0})])
def test_a_key_answered_5xx_is_not_remembered(make_sandbox, session, path, options):
    sandbox = make_sandbox(rate=100, burst=10, **options)
    statuses = [session.get(sandbox.url + path, headers={KEY: "k"}).status_code for _ in range(3)]
    assert statuses[0] >= 500 and len(set(statuses)) == 1
    stats = sandbox.stats()
    assert (stats["arrivals"], stats["idempotent_replays"], stats["unique_keys"]) == (3, 0, 0)


def test_a_4xx_answer_is_remembered(make_sandbox, session):
    sandbox = make_sandbox(rate=100, burst=10)
    url = sandbox.url + "/status/404"
    assert [session.get(url, headers={KEY: "k"}).status_code for _ in range(2)] == [404, 404]
    assert (sandbox.stats()["arrivals"], sandbox.stats()["idempotent_replays"]) == (1, 1)


def test_a_key_still_being_answered_gets_409(make_sandbox, session):
    # given a first request with a key that takes half a second to answer
    sandbox = make_sandbox(rate=100, burst=10)
    url = sandbox.url + "/slow?seconds=0.5"
    first: list = []
    slow = threading.Thread(target=lambda: first.append(session.get(url, headers={KEY: "k"})))
    slow.start()
    deadline = time.monotonic() + 5
    while sandbox.stats()["arrivals"] < 1:
        assert time.monotonic() < deadline, "the first request never arrived"
        time.sleep(0.01)
    # when a second one with the same key comes meanwhile (on its own connection)
    with requests.Session() as other:
        other.trust_env = False
        conflict = other.get(url, headers={KEY: "k"})
    slow.join(5)
    # expect: 409 at once, no arrival; after the first is answered, its answer again
    assert conflict.status_code == 409
    assert first[0].status_code == 200
    replay = session.get(url, headers={KEY: "k"})
    assert (replay.status_code, replay.json()) == (200, first[0].json())
    stats = sandbox.stats()
    assert (stats["arrivals"], stats["idempotent_conflicts"], stats["idempotent_replays"]) == (
        1,
        1,
        1,
    )


def test_keys_are_ignored_when_no_header_is_configured(make_sandbox, session):
    sandbox = make_sandbox(rate=100, burst=10, idempotency_header="")
    for _ in range(2):
        session.get(sandbox.url + "/x", headers={KEY: "k"})
    # and another header can be named live, names compared without case
    session.post(sandbox.url + "/__config", json={"idempotency_header": "X-Dedup"})
    for _ in range(2):
        session.get(sandbox.url + "/x", headers={"x-dedup": "k"})
    stats = sandbox.stats(detail=True)
    assert (stats["arrivals"], stats["idempotent_replays"], stats["unique_keys"]) == (3, 1, 1)
    assert [e["idempotency_key"] for e in stats["log"]] == [None, None, "k"]


def test_only_the_newest_keys_are_kept_and_reset_forgets_them(make_sandbox, session):
    sandbox = make_sandbox(rate=100, burst=10, max_idempotency_keys=2)
    url = sandbox.url + "/x"
    for key in ("a", "b", "c", "c", "b", "a"):
        session.get(url, headers={KEY: key})
    # "a" was the oldest of three when "c" came: forgotten, so its repeat is a new arrival
    assert (sandbox.stats()["arrivals"], sandbox.stats()["idempotent_replays"]) == (4, 2)
    sandbox.reset()
    assert "Idempotent-Replayed" not in session.get(url, headers={KEY: "b"}).headers
    stats = sandbox.stats()
    assert (stats["arrivals"], stats["idempotent_replays"], stats["unique_keys"]) == (1, 0, 1)
