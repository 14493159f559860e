"""Drive a sandbox through a shared limiter from several threads, as a job's workers would: the
client side of the adaptive-rate benchmark (bench/adaptive.py) and of its test. Every call is
sent until it succeeds; every response is fed back to the limiter (observe), so 429s block and
cut the adaptive rate as they do in a real job."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

from ratejobs.limiter import Limiter

# Longer than any wait a 40/s run gives a request, far shorter than a hung sandbox would take.
HTTP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DriveResult:
    """What a run sent: successes and 429s in order of time.monotonic()."""

    calls: int
    started: float
    succeeded_at: tuple[float, ...] = field(repr=False)
    throttled_at: tuple[float, ...] = field(default=(), repr=False)

    @property
    def throttled(self) -> int:
        return len(self.throttled_at)

    @property
    def seconds(self) -> float:
        return self.succeeded_at[-1] - self.started

    @property
    def throttled_share(self) -> float:
        """429s among all responses."""
        return self.throttled / (self.calls + self.throttled)

    def pace(self, first: int = 0) -> float:
        """Successes per second from success `first` (0: from the start of the run) to the
        last one."""
        since = self.started if first == 0 else self.succeeded_at[first - 1]
        return (self.calls - first) / (self.succeeded_at[-1] - since)

    def after_last_throttle(self) -> int:
        """How many successes came after the last 429 (all of them when there was none)."""
        last = max(self.throttled_at, default=float("-inf"))
        return sum(1 for at in self.succeeded_at if at > last)


def drive(
    make_limiter: Callable[[], Limiter],
    url: str,
    *,
    calls: int,
    threads: int,
) -> DriveResult:
    """Send `calls` GETs to `url`/items/<i> from `threads` threads, each with its own limiter
    (make_limiter) and HTTP session: acquire, send, observe, release; a 429 is sent again."""
    todo = list(range(calls))
    lock = threading.Lock()
    succeeded: list[float] = []
    throttled_at: list[float] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        limiter = make_limiter()
        with requests.Session() as session:
            session.trust_env = False  # straight to the sandbox on loopback
            barrier.wait()
            try:
                while True:
                    with lock:
                        if not todo:
                            return
                        call = todo.pop()
                    grant = limiter.acquire()
                    try:
                        response = session.get(f"{url}/items/{call}", timeout=HTTP_TIMEOUT_S)
                        limiter.observe(grant, response.status_code, response.headers)
                    finally:
                        limiter.release(grant)
                    with lock:
                        if response.status_code == 429:
                            throttled_at.append(time.monotonic())
                            todo.append(call)
                        else:
                            succeeded.append(time.monotonic())
            except BaseException as exc:  # reported to the caller, not lost in the thread
                errors.append(exc)

    workers = [threading.Thread(target=work, name=f"drive-{i}") for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.monotonic()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return DriveResult(
        calls=len(succeeded),
        started=started,
        succeeded_at=tuple(sorted(succeeded)),
        throttled_at=tuple(sorted(throttled_at)),
    )
