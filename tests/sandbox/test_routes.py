"""The API routes, error injection, latency, and HTTP/1.1 behaviour of the server itself."""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

import pytest
import requests


def test_ordinary_paths_echo_the_request_and_number_arrivals(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True)
    first = session.post(sandbox.url + "/v1/users?page=2&q=", data=b"12345").json()
    assert first == {
        "method": "POST",
        "path": "/v1/users",
        "query": {"page": "2", "q": ""},
        "n": 1,
        "body_bytes": 5,
    }
    assert session.delete(sandbox.url + "/v1/users/7").json()["n"] == 2
    assert session.request("PURGE", sandbox.url + "/cache").json()["method"] == "PURGE"


def test_chunked_request_bodies_are_read_whole(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True)
    response = session.post(sandbox.url + "/upload", data=iter([b"abc", b"defg", b""]))
    assert response.json()["body_bytes"] == 7
    assert session.get(sandbox.url + "/after").status_code == 200  # the connection is sane


@pytest.mark.parametrize("code", [404, 503, 408, 201, 500])
def test_status_route_answers_that_status(make_sandbox, session, code):
    sandbox = make_sandbox(no_limit=True)
    response = session.get(sandbox.url + f"/status/{code}")
    assert response.status_code == code
    assert response.json() == {"status": code, "n": 1}
    assert sandbox.stats()["by_status"] == {str(code): 1}


def test_status_route_is_rate_limited_first(make_sandbox, session):
    sandbox = make_sandbox(rate=1, burst=1)
    statuses = [session.get(sandbox.url + "/status/404").status_code for _ in range(2)]
    assert statuses == [404, 429]
    stats = sandbox.stats()
    assert (stats["errors"], stats["throttled"]) == (1, 1)


def test_status_204_has_no_body(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True)
    response = session.get(sandbox.url + "/status/204")
    assert (response.status_code, response.content) == (204, b"")
    assert session.get(sandbox.url + "/x").status_code == 200  # keep-alive still in step


@pytest.mark.parametrize("path", ["/status/abc", "/status/99", "/status/600", "/redirect"])
def test_malformed_routes_answer_400(make_sandbox, session, path):
    sandbox = make_sandbox(no_limit=True)
    assert session.get(sandbox.url + path).status_code == 400


def test_redirect_answers_302_to_the_given_url(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True)
    target = sandbox.url + "/landed?from=redirect"
    response = session.get(sandbox.url + "/redirect", params={"to": target}, allow_redirects=False)
    assert response.status_code == 302
    assert response.headers["Location"] == target
    followed = session.get(sandbox.url + "/redirect", params={"to": target})
    assert followed.json()["path"] == "/landed"


def test_big_returns_exactly_the_bytes_asked_for(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True)
    for size in (0, 1, 3_000_000):
        response = session.get(sandbox.url + "/big", params={"bytes": size})
        assert len(response.content) == size
        assert response.headers["Content-Length"] == str(size)
    assert session.get(sandbox.url + "/big?bytes=-1").status_code == 400


def test_slow_waits_before_answering(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True)
    started = time.monotonic()
    assert session.get(sandbox.url + "/slow?seconds=0.3").status_code == 200
    assert time.monotonic() - started >= 0.3
    assert session.get(sandbox.url + "/slow?seconds=soon").status_code == 400


def test_latency_delays_api_responses_but_not_control_ones(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True, latency=1.0)
    started = time.monotonic()
    session.get(sandbox.url + "/x")
    assert time.monotonic() - started >= 1.0
    started = time.monotonic()
    session.get(sandbox.url + "/__stats")
    assert time.monotonic() - started < 0.9


def test_error_rate_answers_about_that_fraction_with_500(make_sandbox, session):
    sandbox = make_sandbox(no_limit=True, error_rate=0.25, seed=7)
    statuses = [session.get(sandbox.url + "/x").status_code for _ in range(400)]
    errors = statuses.count(500)
    # 400 draws at p = 0.25: mean 100, standard deviation 8.7
    assert 70 <= errors <= 130
    assert set(statuses) == {200, 500}
    stats = sandbox.stats()
    assert (stats["ok"], stats["errors"]) == (400 - errors, errors)


def test_error_rate_with_a_seed_repeats_itself(make_sandbox, session):
    def run() -> list[int]:
        sandbox = make_sandbox(no_limit=True, error_rate=0.5, seed=42)
        return [session.get(sandbox.url + "/x").status_code for _ in range(40)]

    assert run() == run()


def test_keep_alive_serves_many_requests_on_one_connection(make_sandbox):
    sandbox = make_sandbox(no_limit=True)
    parts = urlsplit(sandbox.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        connection.request("GET", "/first")
        connection.getresponse().read()
        sock = connection.sock
        for i in range(50):
            method = "HEAD" if i % 5 == 0 else "GET"
            connection.request(method, f"/n/{i}")
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200
            assert response.getheader("Content-Length") is not None
            if method == "GET":
                assert len(body) == int(response.getheader("Content-Length"))
            else:
                assert body == b""
            assert connection.sock is sock  # never reconnected
    finally:
        connection.close()


def test_stop_ends_idle_and_busy_connections_and_their_threads(make_sandbox, session):
    # given a keep-alive connection left open and a request sleeping for 30 s
    threads_before = threading.active_count()
    sandbox = make_sandbox(no_limit=True)
    url = sandbox.url
    session.get(url + "/idle")
    outcome: list[object] = []

    def slow_request() -> None:
        with requests.Session() as client:
            client.trust_env = False
            try:
                outcome.append(client.get(url + "/slow?seconds=30", timeout=60))
            except requests.ConnectionError as exc:
                outcome.append(exc)

    client = threading.Thread(target=slow_request)
    client.start()
    time.sleep(0.2)
    # when the sandbox stops
    started = time.monotonic()
    sandbox.stop()
    client.join(10)
    # expect: it does not wait for the sleeper, and leaves no thread behind
    assert time.monotonic() - started < 5
    assert outcome
    assert threading.active_count() == threads_before, threading.enumerate()
    with pytest.raises(requests.ConnectionError):
        session.get(url + "/x", timeout=2)
