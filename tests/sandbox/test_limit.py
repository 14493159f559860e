"""The sandbox enforces its own limit on arrival, whatever clients do."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import requests

from ratejobs.limiter.headers import parse_quota
from tests.sandbox.conftest import worst_window_excess

THREADS = 3


def send_paced(url: str, per_second: float, seconds: float, statuses: Counter) -> None:
    with requests.Session() as client:
        client.trust_env = False
        deadline = time.monotonic() + seconds
        next_send = time.monotonic()
        while next_send < deadline:
            statuses[client.get(url).status_code] += 1
            next_send += 1 / per_second
            time.sleep(max(0.0, next_send - time.monotonic()))


@pytest.mark.paced
def test_limit_holds_when_clients_send_three_times_too_fast(make_sandbox):
    # given 20/s burst 3, and 3 threads each sending 20/s for 1.5 s
    rate, burst, seconds = 20, 3, 1.5
    sandbox = make_sandbox(rate=rate, burst=burst)
    counts = [Counter() for _ in range(THREADS)]
    threads = [
        threading.Thread(target=send_paced, args=(sandbox.url + "/items", rate, seconds, c))
        for c in counts
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    elapsed = time.monotonic() - started
    statuses = sum(counts, Counter())
    stats = sandbox.stats(detail=True)
    # expect: what clients saw is what the server counted
    assert set(statuses) == {200, 429}
    assert stats["arrivals"] == statuses.total()
    assert (stats["ok"], stats["throttled"], stats["errors"]) == (statuses[200], statuses[429], 0)
    # ... the server let through its rate and never more (the low bound is loose: it only says
    # the limit does not throttle far below its rate, on a machine busy with other work)
    assert statuses[200] <= burst + elapsed * rate
    assert statuses[200] >= 0.5 * seconds * rate
    assert statuses[429] > 0
    # ... and every window of admitted arrivals keeps the bound, by the server's count and ours
    assert stats["worst_window_admitted"] <= stats["allowed"] == burst + rate
    admitted = [entry["t"] for entry in stats["log"] if entry["status"] == 200]
    assert worst_window_excess(admitted, rate=rate, period=1.0, burst=burst) <= 0
    assert stats["worst_window"] > stats["allowed"]  # the clients did send too fast


def test_real_rate_below_the_advertised_one_is_enforced(make_sandbox, session):
    # given a server that says 100/s but lets only 10/s through
    sandbox = make_sandbox(rate=100, real_rate=10, burst=2)
    started = time.monotonic()
    responses = [session.get(sandbox.url + "/x") for _ in range(40)]
    elapsed = time.monotonic() - started
    # expect: far fewer than 40 admitted, as 10/s allows...
    admitted = sum(r.status_code == 200 for r in responses)
    assert 2 <= admitted <= 2 + elapsed * 10
    # ... while every response advertised 100, and some 429s still claimed quota left
    hints = [parse_quota(r.headers, now=time.time()) for r in responses]
    assert {hint.limit for hint in hints} == {100}
    pairs = zip(responses, hints, strict=True)
    claimed_left = [hint.remaining for r, hint in pairs if r.status_code == 429]
    assert max(claimed_left) > 0
    stats = sandbox.stats()
    assert stats["allowed"] == 2 + 10
    assert stats["worst_window_admitted"] <= stats["allowed"]


def test_no_limit_never_throttles(make_sandbox, session):
    sandbox = make_sandbox(rate=1, burst=1, no_limit=True)
    assert {session.get(sandbox.url + "/x").status_code for _ in range(30)} == {200}
    stats = sandbox.stats()
    assert stats["throttled"] == 0
    assert stats["allowed"] is None


def test_period_longer_than_a_second_spreads_the_rate(make_sandbox, session):
    # given 2 per 10 s with burst 2: the third request must wait 5 s
    sandbox = make_sandbox(rate=2, period=10, burst=2)
    statuses = [session.get(sandbox.url + "/x").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    throttled = session.get(sandbox.url + "/x")
    assert 4 <= int(throttled.headers["Retry-After"]) <= 5
    assert sandbox.stats()["allowed"] == 2 + 2
