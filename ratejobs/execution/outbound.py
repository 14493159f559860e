"""Which addresses the workers may connect to: public unicast addresses, plus the networks and
host names an operator allows. Checked when an API is saved and again at connect time, on every
address a host name resolves to, so neither a later DNS answer nor a redirect gets around it.
Job callbacks have a policy of their own, from another setting (ratejobs.services.callbacks)."""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# The setting (and environment variable) operators allow internal addresses for APIs with;
# messages name a policy's setting so whoever reads a refusal knows where to look.
ALLOW_SETTING = "RATEJOBS_OUTBOUND_ALLOW"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# socket.getaddrinfo's signature: (host, port, family, type, proto, flags) -> list of
# (family, type, proto, canonname, sockaddr). Tests pass their own to simulate DNS answers.
Resolver = Callable[..., Sequence[tuple[Any, ...]]]


def _table(rows: Iterable[tuple[str, str]]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), why) for net, why in rows)


# Not public, whatever ipaddress's flags say in this Python version (they changed in 3.11.10,
# 3.12.4 and 3.13): IANA's special-purpose registries, with the reason a refusal gives.
_SPECIAL_V4 = _table(
    [
        ("0.0.0.0/8", "'this network' (0.0.0.0 reaches the local host)"),
        ("10.0.0.0/8", "a private network"),
        ("100.64.0.0/10", "carrier-grade NAT (shared address space)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (where cloud metadata services answer)"),
        ("172.16.0.0/12", "a private network"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation (TEST-NET-1)"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "a private network"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation (TEST-NET-2)"),
        ("203.0.113.0/24", "documentation (TEST-NET-3)"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved (and broadcast)"),
    ]
)
_SPECIAL_V6 = _table(
    [
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        ("2001::/32", "Teredo tunnel"),
        ("2001::/23", "IETF protocol assignments"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment routing (SRv6)"),
        ("fc00::/7", "unique local (a private network)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    ]
)
# Every public IPv6 unicast address is in here today; anything else is special or unassigned.
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
# IPv6 forms that carry an IPv4 address a packet ends up at: judged by that address.
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

_LABEL = r"(?!-)[a-z0-9_-]{1,63}(?<!-)"
_HOST_NAME = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*\.?$")


@dataclass(frozen=True)
class Verdict:
    """Whether one address may be connected to, and why (a refusal's reason names the range)."""

    allowed: bool
    address: str
    reason: str


@dataclass(frozen=True)
class OutboundPolicy:
    """Public unicast addresses, plus `networks`, plus whatever `hosts` resolve to. A host
    entry "*.corp.internal" allows every name under corp.internal (not corp.internal itself).
    `setting` names where the allow-list comes from, in its refusals and errors."""

    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = field(default_factory=frozenset)
    setting: str = ALLOW_SETTING

    @classmethod
    def from_allow_list(
        cls, entries: Iterable[str], *, setting: str = ALLOW_SETTING
    ) -> OutboundPolicy:
        """Entries are CIDRs ("10.0.0.0/8"), addresses ("10.1.2.3") or host names
        ("billing.internal", "*.corp.internal"); an entry may hold several, comma-separated.
        ValueError names the first bad entry."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for item in entries:
            if not isinstance(item, str):
                raise ValueError(f"{setting}: entries must be strings, not {item!r}")
            for raw in item.split(","):
                entry = raw.strip()
                if entry:
                    parsed = _parse_entry(entry, setting)
                    if isinstance(parsed, str):
                        hosts.add(parsed)
                    else:
                        networks.append(parsed)
        return cls(networks=tuple(dict.fromkeys(networks)), hosts=frozenset(hosts), setting=setting)

    def allows_host(self, host: str) -> bool:
        """Whether the allow-list names `host` (case-insensitive, exact or under a "*." entry)."""
        name = _normal_host(host)
        if not name:
            return False
        if name in self.hosts:
            return True
        return any(h.startswith("*.") and name.endswith(h[1:]) for h in self.hosts)

    def allows(self, address: str | IPAddress, *, host: str | None = None) -> Verdict:
        """The verdict on connecting to `address`, which `host` (if given) resolved to."""
        ip = _parse_address(address)
        text = str(ip)
        if host is not None and self.allows_host(host):
            return Verdict(True, text, f"host {_normal_host(host)} is in {self.setting}")
        # ::ffff:127.0.0.1 and friends reach the IPv4 address inside: judge that.
        effective = _embedded_ipv4(ip) or ip
        for candidate in dict.fromkeys((ip, effective)):
            for network in self.networks:
                if candidate.version == network.version and candidate in network:
                    return Verdict(True, text, f"{network} is in {self.setting}")
        why_not = _why_not_public(effective)
        if why_not is None:
            return Verdict(True, text, "a public address")
        if effective is not ip:
            why_not = f"{why_not}, as {effective} inside {ip}"
        return Verdict(False, text, why_not)


class AddressRefused(Exception):
    """No address of a host may be connected to. Raised at connect time, before any byte is
    sent; not an OSError, so the HTTP stack neither retries it nor files it as a network
    error."""

    def __init__(self, verdict: Verdict, host: str, setting: str = ALLOW_SETTING) -> None:
        super().__init__(refusal_message(verdict, host, setting))
        self.verdict = verdict
        self.host = host


def refusal_message(verdict: Verdict, host: str, setting: str = ALLOW_SETTING) -> str:
    where = verdict.address if _normal_host(host) == verdict.address else (
        f"{verdict.address} of host {host}"
    )  # fmt: skip
    return f"address {where} is not allowed by the outbound policy ({setting}): {verdict.reason}"


@functools.lru_cache(maxsize=8)
def _cached_policy(entries: tuple[str, ...], setting: str) -> OutboundPolicy:
    return OutboundPolicy.from_allow_list(entries, setting=setting)


def policy_for(entries: Iterable[str], *, setting: str = ALLOW_SETTING) -> OutboundPolicy:
    """OutboundPolicy.from_allow_list, parsed once per process for each allow-list."""
    return _cached_policy(tuple(entries), setting)


def check_url_allowed(
    url: str, policy: OutboundPolicy, resolver: Resolver = socket.getaddrinfo
) -> None:
    """ValueError when any address `url`'s host resolves to is refused (a literal address,
    and numeric forms like 0x7f000001 or 127.1, resolve to themselves as the C library reads
    them). A name that does not resolve here passes: the workers' network may resolve it, and
    the connect-time check still applies there. The message never quotes the URL's query."""
    refused = refused_address(url, policy, resolver)
    if refused is not None:
        raise ValueError(
            f"{refused}. To allow it, add the address, its network or the host name to "
            f"{policy.setting}"
        )


def refused_address(
    url: str, policy: OutboundPolicy, resolver: Resolver = socket.getaddrinfo
) -> AddressRefused | None:
    """The refusal of the first refused address `url`'s host resolves to; None when every
    address is allowed, or the name does not resolve (see check_url_allowed)."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise ValueError("the URL has no host")
    if policy.allows_host(host):
        return None
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        answers = resolver(host, port, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    for answer in answers:
        verdict = policy.allows(answer[4][0], host=host)
        if not verdict.allowed:
            return AddressRefused(verdict, host, policy.setting)
    return None


def connect_allowed(
    host: str,
    port: int,
    policy: OutboundPolicy,
    *,
    timeout: float | None,
    resolver: Resolver = socket.getaddrinfo,
    family: int = socket.AF_UNSPEC,
    source_address: tuple[str, int] | None = None,
    socket_options: Iterable[tuple[int, int, int | bytes]] = (),
) -> socket.socket:
    """A TCP socket connected to an allowed address of `host`.

    Resolves once and connects to the very addresses judged, in the resolver's order, skipping
    refused ones: a second lookup (socket.create_connection's) could answer differently (DNS
    rebinding). AddressRefused when every address is refused; otherwise the last connect error,
    as socket.create_connection raises it (socket.gaierror when the name does not resolve)."""
    name = host.strip("[]")
    refused: Verdict | None = None
    error: OSError | None = None
    for af, socktype, proto, _, sockaddr in resolver(name, port, family, socket.SOCK_STREAM):
        verdict = policy.allows(sockaddr[0], host=name)
        if not verdict.allowed:
            refused = refused or verdict
            continue
        sock = socket.socket(af, socktype, proto)
        try:
            for option in socket_options:
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    if error is not None:
        raise error
    if refused is not None:
        raise AddressRefused(refused, name, policy.setting)
    raise OSError(f"no address found for {name}")


def _parse_entry(entry: str, setting: str) -> IPNetwork | str:
    text = entry.strip("[]") if entry.startswith("[") else entry
    try:
        return ipaddress.ip_network(text)  # a bare address is a /32 or /128
    except ValueError:
        pass
    loose = None
    with contextlib.suppress(ValueError):
        loose = ipaddress.ip_network(text, strict=False)
    if loose is not None:
        raise ValueError(f"{setting}: {entry!r} has host bits set; did you mean {loose}?")
    name = entry.lower()
    if not _HOST_NAME.match(name) or name in ("*.", "*"):
        raise ValueError(
            f"{setting}: {entry!r} is neither a network in CIDR form (10.0.0.0/8), an "
            "address nor a host name (api.internal, *.corp.internal)"
        )
    last = name.rstrip(".").rsplit(".", 1)[-1]
    if last.isdigit() or last.startswith("0x"):
        # 127.1 or 0x7f000001 read as a name would allow whatever "resolves" from it.
        raise ValueError(
            f"{setting}: {entry!r} looks like an address in a shorthand form; write it "
            "as a dotted quad or a CIDR (127.0.0.1, 127.0.0.0/8)"
        )
    return name.rstrip(".")


def _normal_host(host: str) -> str:
    return host.strip("[]").rstrip(".").lower()


def _parse_address(address: str | IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return address
    text = address.strip("[]")
    ip = ipaddress.ip_address(text)
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        ip = ipaddress.IPv6Address(text.split("%", 1)[0])  # fe80::1%eth0: the zone is no part
    return ip


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64:
        return low32
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # ::a.b.c.d, but not :: or ::1
        return low32
    return None


def _why_not_public(ip: IPAddress) -> str | None:
    """None for a public unicast address; otherwise what the address is."""
    table = _SPECIAL_V4 if ip.version == 4 else _SPECIAL_V6
    for network, why in table:
        if ip in network:
            return why
    if isinstance(ip, ipaddress.IPv6Address) and ip not in _GLOBAL_UNICAST_V6:
        return "not a global unicast IPv6 address (outside 2000::/3)"
    # Belt and braces: whatever this Python's ipaddress knows beyond the tables above.
    flags = ("multicast", "reserved", "unspecified", "loopback", "link_local", "private")
    for flag in flags:
        if getattr(ip, f"is_{flag}"):
            return flag.replace("_", "-")
    if getattr(ip, "is_site_local", False):
        return "site-local"
    if not ip.is_global:
        return "not a global address"
    return None
