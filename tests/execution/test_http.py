"""send() against a real HTTP server: redirects stay on the origin, bodies are capped, and
network failures come back as results."""

from __future__ import annotations

import json
import os
import socket
import time
from urllib.parse import quote

import pytest

from ratejobs.execution import HttpRequest, send, session_for_process
from ratejobs.execution.http import MAX_REDIRECTS
from tests.execution.conftest import free_port


def get(url: str, **headers: str) -> HttpRequest:
    return HttpRequest("GET", url, headers)


def test_ok_response_is_a_result_with_status_headers_body_and_duration(
    http_server, session, marker
):
    result = send(session, get(http_server.url(f"/ok?m={marker}")))
    assert result.ok and result.status_code == 200
    assert result.body == b"ok" and not result.truncated
    assert result.header("content-type") == "text/plain"
    assert result.error_kind is None and result.error == ""
    assert 0 < result.duration < 5
    assert len(http_server.requests_with(marker)) == 1


def test_connection_is_reused_for_the_next_call(http_server, session, marker):
    for _ in range(3):
        send(session, get(http_server.url(f"/ok?m={marker}")))
    ports = {s.client_port for s in http_server.requests_with(marker)}
    assert len(ports) == 1


def test_error_statuses_are_results_not_exceptions(http_server, session):
    for code in (404, 429, 500, 503):
        result = send(session, get(http_server.url(f"/status/{code}")))
        assert result.status_code == code and result.error_kind is None


def test_method_headers_and_body_reach_the_server(http_server, session):
    request = HttpRequest(
        "POST",
        http_server.url("/echo"),
        {"Authorization": "Bearer tok", "Content-Type": "application/json"},
        b'{"a":1}',
    )
    echoed = json.loads(send(session, request).body)
    assert echoed["method"] == "POST" and echoed["body"] == '{"a":1}'
    assert echoed["headers"]["Authorization"] == "Bearer tok"
    assert echoed["headers"]["User-Agent"].startswith("ratejobs/")


def test_same_origin_redirects_are_followed_keeping_credentials(http_server, session, marker):
    result = send(session, get(http_server.url(f"/chain/3/{marker}"), Authorization="Bearer t"))
    assert result.status_code == 200 and result.body == b"end of chain"
    assert result.redirects == 3 and result.url.endswith(f"/chain/0/{marker}")
    seen = http_server.requests_with(marker)
    assert len(seen) == 4
    assert all(s.headers.get("Authorization") == "Bearer t" for s in seen)


def test_redirects_beyond_the_limit_return_the_last_3xx(http_server, session, marker):
    result = send(session, get(http_server.url(f"/chain/{MAX_REDIRECTS + 3}/{marker}")))
    # expect: MAX_REDIRECTS followed, then the next 302 is the answer
    assert result.status_code == 302 and result.redirects == MAX_REDIRECTS
    assert len(http_server.requests_with(marker)) == MAX_REDIRECTS + 1


def test_redirect_to_another_host_is_not_followed(http_server, session, marker):
    # given 127.0.0.1 redirecting to localhost (same server, another host name)
    target = http_server.url(f"/echo?m={marker}", host="localhost")
    url = http_server.url(f"/redirect?to={quote(target, safe='')}")
    result = send(session, get(url, Authorization="Bearer secret"))
    # expect: the 302 is the result and the credentials never went to the other host
    assert result.status_code == 302 and result.redirects == 0
    assert result.header("Location") == target
    assert [s for s in http_server.requests_with(marker) if s.path.startswith("/echo")] == []


@pytest.mark.parametrize(
    "target",
    [
        "https://127.0.0.1:{port}/ok",  # same host, another scheme
        "http://127.0.0.1:{other}/ok",  # same host, another port
        "http://evil.example/ok",
    ],
)
def test_redirect_to_another_origin_is_not_followed(http_server, session, target):
    location = target.format(port=http_server.port, other=free_port())
    result = send(session, get(http_server.url(f"/redirect?to={quote(location, safe='')}")))
    assert result.status_code == 302 and result.redirects == 0


def test_303_turns_a_post_into_a_get_without_body(http_server, session, marker):
    url = http_server.url(f"/redirect?code=303&to={quote(f'/echo?m={marker}', safe='')}")
    request = HttpRequest("POST", url, {"Content-Type": "application/json"}, b"{}")
    echoed = json.loads(send(session, request).body)
    assert echoed["method"] == "GET" and echoed["body"] == ""
    assert "Content-Type" not in echoed["headers"]


def test_307_repeats_the_post_with_its_body(http_server, session, marker):
    url = http_server.url(f"/redirect?code=307&to={quote(f'/echo?m={marker}', safe='')}")
    echoed = json.loads(send(session, HttpRequest("POST", url, {}, b"payload")).body)
    assert echoed["method"] == "POST" and echoed["body"] == "payload"


def test_body_is_capped_and_flagged_truncated(http_server, session):
    result = send(session, get(http_server.url("/big?size=3000000")), max_body_bytes=1000)
    assert result.status_code == 200 and result.truncated
    assert result.body == b"b" * 1000


def test_body_exactly_at_the_cap_is_not_truncated(http_server, session):
    result = send(session, get(http_server.url("/big?size=1000")), max_body_bytes=1000)
    assert len(result.body) == 1000 and not result.truncated


def test_default_cap_is_one_mebibyte(http_server, session):
    result = send(session, get(http_server.url(f"/big?size={2 * 1024 * 1024}")))
    assert len(result.body) == 1024 * 1024 and result.truncated


def test_slow_response_is_a_timeout_result(http_server, session):
    result = send(session, get(http_server.url("/slow?seconds=2")), read_timeout=0.3)
    assert result.status_code is None and result.error_kind == "timeout"
    assert "0.3s" in result.error
    assert result.duration < 1.5


def test_trickling_response_hits_the_total_timeout(http_server, session):
    # given a body that arrives one byte per 0.1 s: no single read times out
    url = http_server.url("/trickle?bytes=50&interval=0.1")
    result = send(session, get(url), read_timeout=1, total_timeout=0.5)
    assert result.error_kind == "timeout" and "in total" in result.error
    assert result.status_code == 200 and result.truncated
    assert result.duration < 2


def test_connection_refused_is_a_connect_result(session):
    result = send(session, get(f"http://127.0.0.1:{free_port()}/ok?api_key=s3cr3t"))
    assert result.status_code is None and result.error_kind == "connect"
    assert "refused" in result.error.lower()
    assert "s3cr3t" not in result.error


def test_unresolvable_host_is_a_connect_result(session):
    result = send(session, get("http://no-such-host.invalid/ok"), connect_timeout=2)
    assert result.error_kind == "connect"


def test_hang_up_without_response_is_a_connection_result(http_server, session):
    result = send(session, get(http_server.url("/drop")))
    assert result.status_code is None and result.error_kind == "connection"


def test_body_cut_short_is_a_connection_result_with_what_arrived(http_server, session):
    result = send(session, get(http_server.url("/short")))
    assert result.error_kind == "connection" and result.status_code == 200
    assert result.body == b"0123456789"


def test_connect_timeout_is_a_connect_result():
    # given a listener whose accept queue is full: the next connection attempt gets no answer
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.1)
        started = time.monotonic()
        from ratejobs.execution.http import new_session

        result = send(new_session(), get(f"http://127.0.0.1:{port}/"), connect_timeout=0.3)
        if result.error_kind != "connect" or "within" not in result.error:
            pytest.skip(f"this network stack does not stall a full accept queue: {result!r}")
        assert time.monotonic() - started < 2
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_cookies_set_by_one_call_never_reach_another(http_server, session, marker):
    send(session, get(http_server.url("/cookie")))
    echoed = json.loads(send(session, get(http_server.url(f"/echo?m={marker}"))).body)
    assert "Cookie" not in echoed["headers"]


def test_malformed_url_raises_without_quoting_its_query(session):
    with pytest.raises(ValueError) as refused:
        send(session, get("http://:80/x?api_key=s3cr3t"))
    assert "s3cr3t" not in str(refused.value)


def test_head_has_no_body(http_server, session):
    result = send(session, HttpRequest("head", http_server.url("/ok")))
    assert result.status_code == 200 and result.body == b""


def test_one_session_per_process_made_anew_after_fork():
    parent = session_for_process()
    assert session_for_process() is parent
    adapter = parent.get_adapter("https://api.x.com")
    assert adapter._pool_maxsize == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a new session, and the same one on the second call
        child = session_for_process()
        ok = child is not parent and session_for_process() is child
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
