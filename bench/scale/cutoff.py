"""A worker host off the network for a while, as if its cable were pulled: its veth's end on
the bridge down (its own end stays up, so its sockets wait and retransmit rather than fail at
once), then up again; and when it came back, as the database saw it (a heartbeat of its
processes, a call claimed by one of them)."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from bench.scale import net
from bench.scale.net import Host
from devtools.processes import group_pids

# Twice faults.chaos' RATEJOBS_WORKER_DEAD_AFTER (10 s): the host's claims are taken back while
# it is away, and its requests already sent wait out several TCP retransmissions.
CUT_SECONDS = 20.0
# After the link is back: TCP's retransmission backoff alone may take ~15 s to try again.
REJOIN_TIMEOUT = 60.0
WATCH_SECONDS = 0.25
# At the fault, the cut waits up to this long for the host to hold running calls.
HOLDING_TIMEOUT = 5.0


@dataclass
class CutOff:
    """`strike()` cuts `host` off in a thread of its own and returns at once (the job is being
    polled meanwhile); `join()` waits for it to end and says what it saw."""

    host: Host
    group: int  # the process group of the host's Celery worker
    running: int | None = None  # calls the host's processes held when it was cut off
    rejoined: float | None = None  # a heartbeat of its processes, seconds after the link came up
    took_call: float | None = None  # a call claimed by one of them, seconds after
    left_when_back: int | None = None  # calls not final when the link came up
    errors: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def strike(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cut-off", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.errors.append(f"the cut-off's watch still running after {timeout:g} s")

    def _owners(self) -> list[str]:
        from ratejobs.models import WorkerProcess

        pids = group_pids(self.group)
        return list(WorkerProcess.objects.filter(pid__in=pids).values_list("owner", flat=True))

    def _run(self) -> None:
        from django.db import connection

        from ratejobs.infra.clock import database_now
        from ratejobs.models import Call, WorkerProcess

        try:
            running = Call.objects.filter(status=Call.Status.RUNNING)
            # a claim is its call and token: one held at the cut is not a call taken after.
            # Cut while the host holds calls, so that taking them over is what the row tries.
            deadline = time.monotonic() + HOLDING_TIMEOUT
            while True:
                claims = running.filter(claim_owner__in=self._owners())
                held = set(claims.values_list("pk", "claim_token"))
                if held or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            self.running = len(held)
            net.ip("link", "set", self.host.link, "down", namespace=net.NET)
            try:
                time.sleep(CUT_SECONDS)
            finally:
                net.ip("link", "set", self.host.link, "up", namespace=net.NET)
            up, up_db = time.monotonic(), database_now()
            unfinished = Call.objects.filter(status__in=(Call.Status.PENDING, Call.Status.RUNNING))
            self.left_when_back = unfinished.count()
            while time.monotonic() - up < REJOIN_TIMEOUT:
                owners = self._owners()
                if (
                    self.rejoined is None
                    and WorkerProcess.objects.filter(owner__in=owners, seen_at__gt=up_db).exists()
                ):
                    self.rejoined = time.monotonic() - up
                claims = running.filter(claim_owner__in=owners).values_list("pk", "claim_token")
                if self.took_call is None and set(claims) - held:
                    self.took_call = time.monotonic() - up
                if self.rejoined is not None and (
                    self.took_call is not None or not unfinished.exists()
                ):
                    return
                time.sleep(WATCH_SECONDS)
        except Exception as exc:  # noqa: BLE001 (said in the row, and the link put back up)
            self.errors.append(f"cut-off: {type(exc).__name__}: {exc}")
            with contextlib.suppress(net.TopologyError):
                net.ip("link", "set", self.host.link, "up", namespace=net.NET)
        finally:
            connection.close()  # this thread's own
