"""The outbound address policy: the verdict on one address (pure), the check at API save time
(through the C library's resolver on numeric forms, never the network), and the check at
connect time against real sockets on loopback only: 127.0.0.1 allowed, 127.0.0.2 not."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from ratejobs.execution import HttpRequest, classify, send
from ratejobs.execution.connections import new_session
from ratejobs.execution.outbound import (
    ALLOW_SETTING,
    OutboundPolicy,
    check_url_allowed,
    policy_for,
)
from tests.realhttp import LOOPBACK

DEFAULT = OutboundPolicy()


def numeric_only(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002 - getaddrinfo's
    """getaddrinfo as the workers call it, but never asking DNS: literal and numeric forms
    (0x7f000001, 127.1, 0177.0.0.1) are parsed by the C library exactly as without the flag."""
    return socket.getaddrinfo(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)


def answers(*addresses: str):
    """A resolver that answers every name with `addresses`, in that order."""

    def resolve(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
        return [_info(address, port) for address in addresses]

    return resolve


def _info(address: str, port: int):
    if ":" in address:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))


def rebinding(*rounds: tuple[str, ...]):
    """A resolver whose answer changes on each lookup (the last one repeats): a DNS server
    that says "public" to the check at save time, "internal" to the connection later."""
    calls = iter(rounds)
    last: list[tuple[str, ...]] = [rounds[0]]

    def resolve(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
        last[0] = next(calls, last[0])
        return [_info(address, port) for address in last[0]]

    return resolve


# --- the verdict on one address --------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.0.0.2", "loopback"),
        ("127.255.255.254", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.254", "carrier-grade NAT"),
        ("192.0.0.8", "IETF"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.254", "benchmarking"),
        ("192.0.2.1", "documentation"),
        ("0.0.0.0", "this network"),  # noqa: S104 - judged, never bound
        ("0.1.2.3", "this network"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fc00::1", "unique local"),
        ("fd12:3456:789a::1", "unique local"),
        ("fe80::1", "link-local"),
        ("fe80::1%lo", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("100::1", "discard"),
        ("::2", "this network"),  # IPv4-compatible ::0.0.0.2
        ("4000::1", "outside 2000::/3"),
        # IPv4 inside IPv6: judged by the IPv4 address the packet ends up at
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:10.1.2.3", "private"),
        ("::127.0.0.1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("64:ff9b::7f00:1", "loopback"),
        ("64:ff9b:1::a9fe:a9fe", "local-use NAT64"),
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", "link-local"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
    ],
)
def test_the_default_policy_refuses_every_address_that_is_not_public_unicast(address, why):
    verdict = DEFAULT.allows(address)
    assert not verdict.allowed
    assert why in verdict.reason


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "2606:4700::1111",
        "2001:4860:4860::8888",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8
        "2002:808:808::1",  # 6to4 of 8.8.8.8
    ],
)
def test_the_default_policy_allows_public_unicast_addresses(address):
    assert DEFAULT.allows(address).allowed


def test_a_refusal_inside_ipv6_names_the_ipv4_address_it_reaches():
    verdict = DEFAULT.allows("::ffff:169.254.169.254")
    assert "169.254.169.254" in verdict.reason and "link-local" in verdict.reason


def test_an_allowed_network_allows_its_addresses_in_either_form():
    policy = OutboundPolicy.from_allow_list(["10.0.0.0/8"])
    assert policy.allows("10.1.2.3").allowed
    assert policy.allows("::ffff:10.1.2.3").allowed
    assert "10.0.0.0/8" in policy.allows("10.1.2.3").reason
    assert not policy.allows("172.16.0.1").allowed
    assert not policy.allows("127.0.0.1").allowed
    assert policy.allows("8.8.8.8").allowed  # public stays allowed


def test_an_allowed_host_name_allows_what_it_resolves_to_and_nothing_else():
    policy = OutboundPolicy.from_allow_list(["Billing.Internal", "*.corp.internal"])
    assert policy.allows("10.9.9.9", host="billing.internal").allowed
    assert policy.allows("10.9.9.9", host="BILLING.internal.").allowed
    assert policy.allows("10.9.9.9", host="a.b.corp.internal").allowed
    assert not policy.allows("10.9.9.9", host="corp.internal").allowed
    assert not policy.allows("10.9.9.9", host="evilcorp.internal").allowed
    assert not policy.allows("10.9.9.9", host="billing.internal.evil.com").allowed
    assert not policy.allows("10.9.9.9").allowed


def test_the_allow_list_takes_comma_separated_entries_of_every_kind():
    policy = OutboundPolicy.from_allow_list(
        [" 10.0.0.0/8 , billing.internal", "192.168.1.5", "[::1]", "fd00::/8", ""]
    )
    assert {str(n) for n in policy.networks} == {
        "10.0.0.0/8",
        "192.168.1.5/32",
        "::1/128",
        "fd00::/8",
    }
    assert policy.hosts == {"billing.internal"}
    assert OutboundPolicy.from_allow_list([]) == DEFAULT


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("10.0.0.1/8", "did you mean 10.0.0.0/8"),
        ("10.0.0.0/33", "CIDR"),
        ("http://billing.internal", "neither"),
        ("billing internal", "neither"),
        ("*", "neither"),
        ("-bad.internal", "neither"),
        ("127.1", "shorthand"),
        ("0x7f000001", "shorthand"),
    ],
)
def test_a_bad_allow_list_entry_is_named_in_the_error(entry, says):
    with pytest.raises(ValueError) as refused:
        OutboundPolicy.from_allow_list(["10.0.0.0/8", entry])
    assert ALLOW_SETTING in str(refused.value) and repr(entry) in str(refused.value)
    assert says in str(refused.value)


def test_a_policy_is_parsed_once_per_allow_list():
    assert policy_for(["127.0.0.1/32"]) is policy_for(("127.0.0.1/32",))
    assert policy_for(["127.0.0.1/32"]) == OutboundPolicy.from_allow_list(["127.0.0.1/32"])


# --- the check when an API is saved: resolver, never a connection ----------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://0x7f000001/",
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://017700000001/",
        "http://127.1/",
        "http://0/",
        "http://0.0.0.0:8080/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0xa9fea9fe/",
        "http://10.0.0.1/",
        "http://172.16.0.1/",
        "http://192.168.0.1/",
        "http://100.64.0.1/",
        "http://[::]/",
        "http://[::1]:8000/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fc00::1]/",
        "http://[fe80::1]/",
        "http://224.0.0.1/",
    ],
)
def test_saving_an_api_on_a_refused_address_fails_in_every_numeric_form(url):
    with pytest.raises(ValueError) as refused:
        check_url_allowed(url + "?api_key=s3cr3t", DEFAULT, resolver=numeric_only)
    message = str(refused.value)
    assert "not allowed by the outbound policy" in message and ALLOW_SETTING in message
    assert "s3cr3t" not in message and "api_key" not in message


@pytest.mark.parametrize("url", ["http://8.8.8.8/", "https://[2606:4700::1111]:8443/v1"])
def test_saving_an_api_on_a_public_address_passes(url):
    check_url_allowed(url, DEFAULT, resolver=numeric_only)


def test_a_name_that_does_not_resolve_here_passes_the_save_time_check():
    def no_dns(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    check_url_allowed("https://api.partner.example/v1", DEFAULT, resolver=no_dns)


def test_a_name_with_any_refused_address_fails_the_save_time_check():
    resolver = answers("8.8.8.8", "10.1.2.3")
    with pytest.raises(ValueError, match="address 10.1.2.3 of host api.partner.example"):
        check_url_allowed("https://api.partner.example/v1", DEFAULT, resolver=resolver)


def test_an_allowed_host_name_is_not_even_resolved_at_save_time():
    def must_not_resolve(*args, **kwargs):
        raise AssertionError("resolved")

    policy = OutboundPolicy.from_allow_list(["billing.internal"])
    check_url_allowed("http://billing.internal:8080/api", policy, resolver=must_not_resolve)


def test_the_loopback_allow_list_admits_loopback_and_only_there():
    check_url_allowed("http://127.0.0.1:9/", LOOPBACK, resolver=numeric_only)
    check_url_allowed("http://[::1]:9/", LOOPBACK, resolver=numeric_only)
    check_url_allowed("http://2130706433:9/", LOOPBACK, resolver=numeric_only)
    with pytest.raises(ValueError, match="127.0.0.2"):
        check_url_allowed("http://127.0.0.2:9/", LOOPBACK, resolver=numeric_only)


# --- at connect time: real sockets on loopback --------------------------------------------


@pytest.fixture
def outside() -> Iterator[socket.socket]:
    """A listener on 127.0.0.2, outside the tests' allow-list; it never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.2", 0))
    listener.listen(8)
    listener.setblocking(False)
    yield listener
    listener.close()


def accepted(listener: socket.socket) -> int:
    """How many connections reached `listener` (the kernel completes them before accept)."""
    count = 0
    while True:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


def get(url: str, **headers: str) -> HttpRequest:
    return HttpRequest("GET", url, headers)


def test_a_connection_outside_the_allow_list_is_refused_before_any_byte_is_sent(outside, session):
    port = outside.getsockname()[1]
    result = send(session, get(f"http://127.0.0.2:{port}/x?api_key=s3cr3t"), read_timeout=1)
    # expect: a result, not an exception, naming the address and the setting; no connection
    assert result.error_kind == "refused" and result.status_code is None
    assert "address 127.0.0.2 is not allowed" in result.error
    assert ALLOW_SETTING in result.error and "s3cr3t" not in result.error
    assert accepted(outside) == 0


def test_the_same_connection_goes_through_once_its_address_is_allowed(outside):
    # the control for the test above: the listener does see a connection the policy allows
    port = outside.getsockname()[1]
    allowing = new_session(OutboundPolicy.from_allow_list(["127.0.0.2/32"]))
    result = send(allowing, get(f"http://127.0.0.2:{port}/"), read_timeout=0.3)
    assert result.error_kind == "timeout"  # connected, and nobody answers
    assert accepted(outside) == 1


@pytest.mark.parametrize("host", ["0x7f000002", "2130706434", "0177.0.0.2", "127.0.2"])
def test_numeric_forms_of_a_refused_address_are_refused_at_connect_time(outside, session, host):
    port = outside.getsockname()[1]
    result = send(session, get(f"http://{host}:{port}/"))
    assert result.error_kind == "refused" and "address 127.0.0.2" in result.error
    assert accepted(outside) == 0


def test_the_default_policy_refuses_the_loopback_server_itself(http_server, marker):
    result = send(new_session(DEFAULT), get(http_server.url(f"/ok?m={marker}")))
    assert result.error_kind == "refused" and "loopback" in result.error
    assert http_server.requests_with(marker) == []


def test_dns_rebinding_after_the_save_time_check_is_refused_at_connect_time(outside, marker):
    # given a name that resolved to the allowed server when the API was saved, then to the
    # refused address when the worker connects
    port = outside.getsockname()[1]
    resolver = rebinding(("127.0.0.1",), ("127.0.0.2",))
    url = f"http://api.rebind.test:{port}/ok?m={marker}"
    check_url_allowed(url, LOOPBACK, resolver=resolver)
    result = send(new_session(LOOPBACK, resolver=resolver), get(url))
    assert result.error_kind == "refused" and "address 127.0.0.2 of host api.rebind" in result.error
    assert accepted(outside) == 0


def test_dns_rebinding_between_two_connections_is_refused_on_the_second(
    http_server, outside, marker
):
    # given a name that first answers with the test server, then with the refused address
    port = http_server.port
    resolver = rebinding(("127.0.0.1",), ("127.0.0.2",))
    session = new_session(LOOPBACK, resolver=resolver)
    url = f"http://api.rebind.test:{port}/ok?m={marker}"
    assert send(session, get(url)).status_code == 200
    session.close()  # the pooled connection goes: the next call connects (and resolves) anew
    listener_on_port = socket.socket()
    try:
        listener_on_port.bind(("127.0.0.2", port))
        listener_on_port.listen(8)
        listener_on_port.setblocking(False)
    except OSError:
        listener_on_port.close()
        listener_on_port = outside
    try:
        result = send(session, get(url))
        assert result.error_kind == "refused"
        assert accepted(listener_on_port) == 0
    finally:
        if listener_on_port is not outside:
            listener_on_port.close()
    assert len(http_server.requests_with(marker)) == 1


def test_only_the_allowed_addresses_of_a_name_are_connected_to(http_server, outside, marker):
    # given a name that resolves to the refused address first, the server's second
    resolver = answers("127.0.0.2", "127.0.0.1")
    session = new_session(LOOPBACK, resolver=resolver)
    result = send(session, get(f"http://mixed.test:{http_server.port}/ok?m={marker}"))
    assert result.status_code == 200
    assert accepted(outside) == 0


def test_a_redirect_to_a_refused_address_is_refused_at_connect_time(
    http_server, outside, session, marker
):
    target = f"http://127.0.0.2:{outside.getsockname()[1]}/x"
    url = http_server.url(f"/redirect?to={quote(target, safe='')}&m={marker}")
    result = send(session, get(url, Authorization="Bearer secret"))
    assert result.error_kind == "refused" and result.redirects == 1
    assert "127.0.0.2" in result.error
    assert accepted(outside) == 0


def test_a_refused_address_fails_the_call_at_once_without_retries(outside, session):
    result = send(session, get(f"http://127.0.0.2:{outside.getsockname()[1]}/"))
    decision = classify(
        result,
        attempts=1,
        max_attempts=5,
        throttled_retries=0,
        max_throttled_retries=5,
        backoff_base=1,
        backoff_cap=10,
        rng=random.Random(0),
    )
    assert decision.kind == "failed" and "127.0.0.2" in decision.error


def test_through_a_proxy_the_target_is_checked_before_sending(
    http_server, second_server, outside, session, marker, monkeypatch
):
    # given the environment's proxy (the test server, on an allowed address)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", http_server.base)
    monkeypatch.setenv("http_proxy", http_server.base)
    # expect: an allowed target goes through the proxy...
    through = send(session, get(second_server.url(f"/echo?m={marker}")))
    assert through.status_code == 200
    assert [s.path for s in http_server.requests_with(marker)] == [
        second_server.url(f"/echo?m={marker}")
    ]
    # ... and a refused one is refused before the proxy sees it
    refused = send(session, get(f"http://127.0.0.2:{outside.getsockname()[1]}/?m={marker}x"))
    assert refused.error_kind == "refused"
    assert http_server.requests_with(f"{marker}x") == []
    assert accepted(outside) == 0
