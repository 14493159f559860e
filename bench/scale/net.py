"""The hosts of the scale run as network namespaces on this machine: one `rjs-net` namespace
holding a bridge, and one namespace per host joined to it by a veth pair. Nothing is added to
the root namespace (no link, no address, no route), so its routing is left as it was."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# Every namespace this module makes starts with it; nothing else on the machine may.
PREFIX = "rjs-"
NET = f"{PREFIX}net"
BRIDGE = "br0"
# RFC 2544's benchmarking range (198.18.0.0/15): never routed on the Internet, never anyone's
# production network. One /24 of it is enough for a handful of hosts.
NETWORK = "198.18.0.0/24"
PREFIX_LENGTH = 24
# Two runs at once would fight over the same namespace names.
LOCK = Path("/run/lock/rjs-scale.lock")
IP_TIMEOUT = 10.0
# Processes still running in a namespace after the run stopped its own get this long after
# SIGTERM before SIGKILL.
KILL_GRACE_SECONDS = 5.0


class TopologyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Host:
    name: str  # the namespace's
    address: str
    link: str  # the veth's end on the bridge, in rjs-net (the host's end is eth0)
    role: str

    def exec_prefix(self) -> list[str]:
        """What runs a command on this host."""
        return ["ip", "netns", "exec", self.name]


SERVICES = Host(f"{PREFIX}svc", "198.18.0.1", "svc", "PostgreSQL, Redis, sandbox API, this run")
WORKER_1 = Host(f"{PREFIX}w1", "198.18.0.11", "w1", "celery worker and beat")
WORKER_2 = Host(f"{PREFIX}w2", "198.18.0.12", "w2", "celery worker")
WEB = Host(f"{PREFIX}web", "198.18.0.21", "web", "gunicorn: REST API")
HOSTS = (SERVICES, WORKER_1, WORKER_2, WEB)


def ip(*args: str, namespace: str | None = None) -> str:
    argv = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT)
    if done.returncode:
        raise TopologyError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def ours() -> list[str]:
    """The namespaces of this machine whose names say they are ours."""
    names = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
    return sorted(name for name in names if name.startswith(PREFIX))


def pids_in(namespace: str) -> list[int]:
    with contextlib.suppress(TopologyError):
        return [int(pid) for pid in ip("netns", "pids", namespace).split()]
    return []


@contextlib.contextmanager
def topology(hosts: Sequence[Host] = HOSTS) -> Iterator[Sequence[Host]]:
    """The namespaces, bridge and veths, removed on the way out (and at exit, and on SIGTERM),
    with whatever still runs inside them."""
    if os.geteuid() != 0:
        raise TopologyError("network namespaces need root (ip netns add)")
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TopologyError(f"another scale run holds {LOCK}") from None
        left = ours()
        if left:
            raise TopologyError(
                f"namespaces of an interrupted run are still there: {', '.join(left)}; "
                "remove them with `python -m bench.scale --clean`"
            )
        atexit.register(destroy, hosts)
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            build(hosts)
            yield hosts
        finally:
            destroy(hosts)
            atexit.unregister(destroy)
            signal.signal(signal.SIGTERM, previous)


def build(hosts: Sequence[Host]) -> None:
    ip("netns", "add", NET)
    ip("link", "set", "lo", "up", namespace=NET)
    ip("link", "add", BRIDGE, "type", "bridge", namespace=NET)
    ip("link", "set", BRIDGE, "up", namespace=NET)
    for host in hosts:
        ip("netns", "add", host.name)
        ip("link", "set", "lo", "up", namespace=host.name)
        # Made inside rjs-net, its far end moved straight into the host: the pair never
        # exists in the root namespace.
        ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.name,
           namespace=NET)  # fmt: skip
        ip("link", "set", host.link, "master", BRIDGE, "up", namespace=NET)
        ip("addr", "add", f"{host.address}/{PREFIX_LENGTH}", "dev", "eth0", namespace=host.name)
        # A bridge without STP (the default) forwards on a port as soon as it is up.
        ip("link", "set", "eth0", "up", namespace=host.name)


def destroy(hosts: Sequence[Host] = HOSTS) -> None:
    """Stop what still runs in our namespaces (only this run started anything there), then
    delete them; deleting a namespace deletes its veths and bridge."""
    names = [host.name for host in hosts] + [NET]
    with contextlib.suppress(TopologyError):
        present = set(ours())
        names = [name for name in names if name in present]
    _kill_inside(names)
    for name in names:
        with contextlib.suppress(TopologyError):
            ip("netns", "del", name)


def clean() -> list[str]:
    """`--clean`: remove every namespace named rjs-* (an interrupted run's), with what runs in
    them."""
    names = ours()
    _kill_inside(names)
    for name in names:
        ip("netns", "del", name)
    return names


def _kill_inside(names: Sequence[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for name in names for pid in pids_in(name) if pid != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + KILL_GRACE_SECONDS
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of ours, not yet reaped, is not running
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    return False


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
