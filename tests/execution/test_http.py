"""send() against a real HTTP server: redirects stay on the origin, bodies are capped, and
network failures come back as results."""

from __future__ import annotations

import json
import os
import socket
import time
from urllib.parse import quote

import pytest

from ratejobs.execution import HttpRequest, build_request, send, session_for_process
from ratejobs.execution.connections import new_session
from ratejobs.execution.http import (
    MAX_REDIRECTS,
    MAX_RESPONSE_HEADER_BYTES,
    MAX_RESPONSE_HEADERS,
    _in_scope,
)
from ratejobs.execution.outbound import OutboundPolicy
from tests.realhttp import LOOPBACK, free_port


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


def test_redirects_under_the_base_path_keep_the_api_credentials(http_server, session, marker):
    request = build_request(
        method="GET",
        base_url=http_server.url("/chain"),
        path=f"3/{marker}",
        credentials={"X-Api-Key": "k-secret"},
    )
    result = send(session, request)
    assert result.status_code == 200 and result.redirects == 3
    seen = http_server.requests_with(marker)
    assert len(seen) == 4 and all(s.headers.get("X-Api-Key") == "k-secret" for s in seen)


@pytest.mark.parametrize(
    ("target", "scope", "inside"),
    [
        ("https://h.x/v2/users", "https://h.x/v2", True),
        ("https://h.x/v2", "https://h.x/v2", True),
        ("https://H.X:443/v2/a?x=1", "https://h.x/v2", True),
        ("https://h.x/v2/a/../b", "https://h.x/v2", True),
        ("https://h.x/anything", "https://h.x", True),
        ("https://h.x/v2x", "https://h.x/v2", False),
        ("https://h.x/v1/users", "https://h.x/v2", False),
        ("https://h.x/v2/%2e%2e/admin", "https://h.x/v2", False),
        ("https://h.x/v2/..%2fadmin", "https://h.x/v2", False),
        ("https://h.x/v2/%252e%252e/admin", "https://h.x/v2", False),
        ("https://h.x/v2/..;x/admin", "https://h.x/v2", False),
        ("https://h.x/v2%2fadmin", "https://h.x/v2", False),
        ("http://h.x/v2/users", "https://h.x/v2", False),
        ("https://h.x:8443/v2/users", "https://h.x/v2", False),
        ("https://other.x/v2/users", "https://h.x/v2", False),
    ],
)
def test_the_credentials_scope_is_the_origin_and_the_base_path(target, scope, inside):
    assert _in_scope(target, scope) is inside


def test_redirects_beyond_the_limit_return_the_last_3xx(http_server, session, marker):
    result = send(session, get(http_server.url(f"/chain/{MAX_REDIRECTS + 3}/{marker}")))
    # expect: MAX_REDIRECTS followed, then the next 302 is the answer
    assert result.status_code == 302 and result.redirects == MAX_REDIRECTS
    assert len(http_server.requests_with(marker)) == MAX_REDIRECTS + 1


def test_redirect_to_another_host_is_followed_without_the_credentials(http_server, session, marker):
    # given 127.0.0.1 redirecting to localhost (same server, another host name)
    target = http_server.url(f"/echo?m={marker}", host="localhost")
    url = http_server.url(f"/redirect?to={quote(target, safe='')}")
    request = HttpRequest(
        "GET",
        url,
        {"X-Api-Key": "k-secret", "Authorization": "Bearer secret", "Cookie": "a=b", "X-Y": "1"},
        credential_headers=frozenset({"X-Api-Key"}),
    )
    result = send(session, request)
    # expect: followed, and the echo server saw none of the credentials, only the other header
    assert result.status_code == 200 and result.redirects == 1
    echoed = json.loads(result.body)["headers"]
    assert {"X-Api-Key", "Authorization", "Cookie"}.isdisjoint(echoed)
    assert echoed["X-Y"] == "1"
    [seen] = [s for s in http_server.requests_with(marker) if s.path.startswith("/echo")]
    assert "k-secret" not in repr(seen.headers) and "Bearer" not in repr(seen.headers)


def test_redirect_to_another_port_is_followed_without_the_credentials(
    http_server, second_server, session, marker
):
    target = second_server.url(f"/echo?m={marker}")
    url = http_server.url(f"/redirect?to={quote(target, safe='')}")
    result = send(session, get(url, Authorization="Bearer secret"))
    assert result.status_code == 200 and result.redirects == 1
    assert "Authorization" not in json.loads(result.body)["headers"]
    assert len(second_server.requests_with(marker)) == 1


def test_redirect_out_of_the_base_path_is_followed_without_the_credentials(
    http_server, session, marker
):
    # given an API based at /api/<marker>, whose endpoint redirects to /echo on the same origin
    base = http_server.url(f"/api/{marker}")
    target = http_server.url(f"/echo?m={marker}")
    request = HttpRequest(
        "GET",
        http_server.url(f"/redirect?to={quote(target, safe='')}&m={marker}"),
        {"X-Api-Key": "k-secret"},
        credential_headers=frozenset({"x-api-key"}),
        base_url=base,
    )
    result = send(session, request)
    assert result.status_code == 200 and result.redirects == 1
    assert "X-Api-Key" not in json.loads(result.body)["headers"]


def test_redirect_to_a_non_http_scheme_is_the_result(http_server, session):
    location = "ftp://127.0.0.1/file"
    result = send(session, get(http_server.url(f"/redirect?to={quote(location, safe='')}")))
    assert result.status_code == 302 and result.redirects == 0 and result.error_kind is None


def test_redirect_to_https_on_a_plain_port_is_followed_and_fails_to_connect(http_server, session):
    # given the same host and port under https: followed (without credentials), and the TLS
    # handshake with a plain HTTP server fails before anything is sent
    location = f"https://127.0.0.1:{http_server.port}/ok"
    url = http_server.url(f"/redirect?to={quote(location, safe='')}")
    result = send(session, get(url, Authorization="Bearer secret"))
    assert result.redirects == 1 and result.error_kind == "connect"


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


def test_trickling_status_line_and_headers_hit_the_total_timeout(http_server, session):
    # given a server that sends its status line and headers one byte every 0.3 s: every read
    # gets a byte well within the read timeout, and the headers take over a minute
    url = http_server.url("/trickle_head?interval=0.3")
    started = time.monotonic()
    result = send(session, get(url), read_timeout=30, total_timeout=1)
    # expect: the total timeout holds for the headers too
    assert time.monotonic() - started < 1.5
    assert result.error_kind == "timeout" and "within 1s in total" in result.error
    assert result.status_code is None


def test_a_slow_hop_after_a_redirect_counts_against_the_total_timeout(http_server, session):
    # given a redirect to a response that takes longer than what is left of the total
    url = http_server.url(f"/redirect?to={quote('/slow?seconds=3', safe='')}")
    started = time.monotonic()
    result = send(session, get(url), read_timeout=30, total_timeout=0.8)
    assert time.monotonic() - started < 1.3
    assert result.error_kind == "timeout" and "in total" in result.error
    assert result.redirects == 1


def vm_hwm_bytes() -> int:
    """This process's peak resident memory so far."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.timeout(60)
def test_a_decompression_bomb_is_cut_at_the_body_cap_without_inflating_it(
    http_server, session, encoding
):
    # given 1 GiB of zeros, compressed on the fly to about 1 MiB on the wire (brotli and zstd
    # decoders are not installed, so urllib3 does not offer or decode them)
    peak_before = vm_hwm_bytes()
    started = time.monotonic()
    result = send(session, get(http_server.url(f"/bomb/{encoding}?mib=1024")))
    took = time.monotonic() - started
    # expect: the cap's worth decoded, the rest never read, and memory barely moved
    assert result.status_code == 200 and result.error_kind is None
    assert result.truncated and result.body == bytes(1024 * 1024)
    assert took < 5
    assert vm_hwm_bytes() - peak_before < 100 * 1024 * 1024


def test_response_headers_beyond_the_count_cap_are_dropped_and_flagged(http_server, session):
    result = send(session, get(http_server.url(f"/headers?count={MAX_RESPONSE_HEADERS + 10}")))
    assert result.status_code == 200 and result.body == b"ok"
    assert len(result.headers) == MAX_RESPONSE_HEADERS and result.headers_truncated
    assert "headers_truncated=True" in repr(result)


def test_response_headers_beyond_the_byte_cap_are_dropped_and_flagged(http_server, session):
    # given three headers of 30 000 bytes (90 000 in all, over the 64 KiB cap), then X-Last
    result = send(session, get(http_server.url("/headers?count=3&size=30000")))
    assert result.status_code == 200 and result.headers_truncated
    kept = sum(len(k) + len(v) for k, v in result.headers.items())
    assert kept <= MAX_RESPONSE_HEADER_BYTES
    assert result.header("X-Pad-0") and result.header("X-Pad-2") is None
    # one header too big to fit is skipped, not the small ones after it
    assert result.header("X-Last") == "last"


def test_ordinary_response_headers_are_kept_whole(http_server, session):
    result = send(session, get(http_server.url("/headers?count=20&size=100")))
    assert not result.headers_truncated and result.header("X-Pad-19") == "v" * 100


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
        result = send(new_session(LOOPBACK), get(f"http://127.0.0.1:{port}/"), connect_timeout=0.3)
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


def test_one_session_per_process_and_policy_made_anew_after_fork():
    parent = session_for_process(LOOPBACK)
    assert session_for_process(LOOPBACK) is parent
    same = OutboundPolicy.from_allow_list(["127.0.0.1/32", "::1/128"])
    assert session_for_process(same) is parent
    assert session_for_process(OutboundPolicy()) is not parent
    # its pool keeps a connection per call the process has in flight (the first caller's size)
    adapter = parent.get_adapter("https://api.x.com")
    assert adapter._pool_maxsize >= 10
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a new session, and the same one on the second call
        child = session_for_process(LOOPBACK)
        ok = child is not parent and session_for_process(LOOPBACK) is child
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
